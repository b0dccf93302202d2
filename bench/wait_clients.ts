/**
 * Callers waiting for their runs, all at once, in a process of their own (so
 * that their CPU is not counted as the API's, nor the bench's as theirs): one
 * `GET /v1/runs/{id}` with `Prefer: wait=<seconds>` per run id, every one in
 * flight together, each on its own connection. Run by the wait section:
 *
 *   deno run --no-prompt --allow-net bench/wait_clients.ts <api url> <token> <seconds> < ids.json
 *
 * The run ids come on stdin as a JSON array. Prints one JSON line: for each
 * run, when its answer had arrived (ms since the epoch, the clock Postgres's
 * `finished_at` is read against), its HTTP status, the run's status and
 * `Preference-Applied`; and this process's CPU and peak RSS.
 */
import process from "node:process";

/** One waiter's answer, as the wait section reads it. */
export interface WaitAnswer {
  run_id: string;
  /** When the whole answer had arrived, ms since the epoch. */
  at: number;
  /** 0 when the request failed without an answer. */
  http: number;
  status: string | null;
  applied: string | null;
  error?: string;
}

/** What the process prints. */
export interface WaitClientsReport {
  answers: WaitAnswer[];
  cpuSeconds: number;
  peakRssMb: number;
}

async function wait(url: string, token: string, seconds: number, runId: string) {
  try {
    const res = await fetch(`${url}/v1/runs/${runId}`, {
      headers: { authorization: `Bearer ${token}`, prefer: `wait=${seconds}` },
    });
    const body = await res.json().catch(() => ({})) as { status?: string };
    return {
      run_id: runId,
      at: Date.now(),
      http: res.status,
      status: body.status ?? null,
      applied: res.headers.get("preference-applied"),
    };
  } catch (err) {
    return { run_id: runId, at: Date.now(), http: 0, status: null, applied: null, error: `${err}` };
  }
}

if (import.meta.main) {
  const [url, token, secs] = Deno.args;
  const seconds = Number(secs);
  if (!url || !token || !(Number.isInteger(seconds) && seconds > 0)) {
    console.error("usage: wait_clients.ts <api url> <token> <seconds> < ids.json");
    Deno.exit(2);
  }
  const ids = JSON.parse(await new Response(Deno.stdin.readable).text()) as string[];
  let peakRss = 0;
  const sampler = setInterval(() => peakRss = Math.max(peakRss, process.memoryUsage().rss), 100);
  const cpu0 = process.cpuUsage();
  const answers: WaitAnswer[] = await Promise.all(ids.map((id) => wait(url, token, seconds, id)));
  const cpu = process.cpuUsage(cpu0);
  clearInterval(sampler);
  peakRss = Math.max(peakRss, process.memoryUsage().rss);
  const report: WaitClientsReport = {
    answers,
    cpuSeconds: (cpu.user + cpu.system) / 1e6,
    peakRssMb: peakRss / 1e6,
  };
  console.log(JSON.stringify(report));
}
