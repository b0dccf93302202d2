/**
 * The wait section, in each round: 2,000 runs of `sleep@1` admitted with
 * `ms` spread over 0–3000, and one `GET /v1/runs/{id}` with `Prefer:
 * wait=30` held for each by a process of its own (bench/wait_clients.ts);
 * once the API holds them all (its `poimen_run_watchers`), a worker starts
 * and runs them, so that they finish over a few seconds while every waiter
 * waits. Measured: every waiter answered with its final run (a count: the
 * bench fails otherwise), the delay from each run's `finished_at` to its
 * waiter's answer, and the API process's CPU and peak RSS meanwhile.
 */
import type { Sql } from "../db/pool.ts";
import { createPool } from "../db/pool.ts";
import { Admission } from "../admission/admit.ts";
import { StaticCatalog } from "../admission/catalog.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { freePort, PoimenProcess } from "../dev/processes.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { delay, SECOND } from "../core/time.ts";
import { cpuSeconds, peakRssMb } from "./tools.ts";
import { type BenchContext, check, log, q, type WaitFigure } from "./run_context.ts";
import { createDb, tenantToken, waitHttp } from "./scenario_support.ts";
import type { WaitClientsReport } from "./wait_clients.ts";

/** The section's size: waiters (one per run), the longest sleep, the wait asked for. */
export interface WaitSize {
  waiters: number;
  maxSleepMs: number;
  waitSeconds: number;
}

/** What the bench measures (a smoke run of the section may ask for less). */
const WAIT_SIZE: WaitSize = { waiters: 2_000, maxSleepMs: 3_000, waitSeconds: 30 };

/** Runs of `sleep@1` whose `ms` are spread evenly over 0..maxSleepMs, in shuffled order. */
async function admitSleeps(url: string, tenant: string, size: WaitSize): Promise<string[]> {
  const sql = createPool({ url, max: 4, applicationName: "bench-admit" });
  const kernel = new Admission(sql, new StaticCatalog(builtinRegistry().catalogVersions()), {
    maxBatch: 500,
    maxConcurrent: 2,
  });
  const ms = Array.from(
    { length: size.waiters },
    (_, i) => Math.round((i * size.maxSleepMs) / Math.max(1, size.waiters - 1)),
  );
  // Claimed in admission order: shuffled, so a run's start says nothing of its length.
  for (let i = ms.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [ms[i], ms[j]] = [ms[j], ms[i]];
  }
  try {
    const results = await Promise.all(
      ms.map((m) =>
        kernel.admit({ workflow_ref: "sleep", input: { ms: m } }, {
          tenantId: tenant,
          source: "bench",
          entry: "http",
        })
      ),
    );
    return results.map((r) => r.run.run_id);
  } finally {
    await sql.end();
  }
}

/** The API's `poimen_run_watchers` (0 while unreadable). */
async function watchers(apiUrl: string): Promise<number> {
  const text = await fetch(`${apiUrl}/metrics`).then((r) => r.text(), () => "");
  return Number(/^poimen_run_watchers (\d+)/m.exec(text)?.[1] ?? 0);
}

/** The callers' process: started with the run ids on stdin; resolves with its report. */
function startWaiters(apiUrl: string, token: string, ids: string[], seconds: number) {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--no-prompt",
      "--allow-net",
      "bench/wait_clients.ts",
      apiUrl,
      token,
      String(seconds),
    ],
    cwd: PROJECT_ROOT,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const writer = child.stdin.getWriter();
  const sent = writer.write(new TextEncoder().encode(JSON.stringify(ids)))
    .then(() => writer.close());
  let exited = false;
  const report = sent.then(() => child.output()).then((out) => {
    exited = true;
    const dec = new TextDecoder();
    if (!out.success) throw new Error(`wait clients exited ${out.code}: ${dec.decode(out.stderr)}`);
    return JSON.parse(dec.decode(out.stdout).trim()) as WaitClientsReport;
  });
  // Failures surface through `report`; nothing is left unhandled meanwhile.
  report.catch(() => {});
  return { report, exited: () => exited, kill: () => child.kill("SIGKILL") };
}

/** One round: see the module comment. */
async function waitRound(
  ctx: BenchContext,
  url: string,
  sql: Sql,
  round: number,
  size: WaitSize,
): Promise<WaitFigure> {
  const tenant = `wait${round}`;
  const token = await tenantToken(sql, tenant);
  const ids = await admitSleeps(url, tenant, size);
  const apiUrl = `http://127.0.0.1:${freePort()}`;
  const api = new PoimenProcess("api", {
    DATABASE_URL: url,
    PORT: new URL(apiUrl).port,
    HOST: "127.0.0.1",
    LOG_LEVEL: "error",
    // What waits cost the API, one tenant holding them all: its share of the
    // process's waits (a tenth by default) lifted to the section's count.
    RUN_WATCHERS_PER_TENANT: String(size.waiters),
  });
  let worker: PoimenProcess | undefined;
  let waiters: ReturnType<typeof startWaiters> | undefined;
  try {
    await waitHttp(`${apiUrl}/readyz`, "api");
    const rssStart = peakRssMb(api.pid);
    const cpu0 = cpuSeconds(api.pid);
    const t0 = performance.now();
    waiters = startWaiters(apiUrl, token, ids, size.waitSeconds);
    // Every wait held before any run starts: none is answered by a run already final.
    const openDeadline = Date.now() + 60 * SECOND;
    while ((await watchers(apiUrl)) < size.waiters) {
      if (waiters.exited() || api.exited || Date.now() > openDeadline) {
        await waiters.report; // its error, if it failed
        throw new Error(`the API holds ${await watchers(apiUrl)} of ${size.waiters} waits`);
      }
      await delay(50);
    }
    const cpuOpened = cpuSeconds(api.pid);
    worker = new PoimenProcess("worker", {
      DATABASE_URL: url,
      // Every run in a slot at once: they end as their sleeps do, over maxSleepMs.
      WORKER_CONCURRENCY: String(size.waiters),
      LOG_LEVEL: "error",
    });
    const report = await waiters.report;
    const wall = (performance.now() - t0) / 1000;
    const apiCpu = cpuSeconds(api.pid) - cpu0;
    const rssPeak = peakRssMb(api.pid);
    ctx.stats("api, holding waits").cpu += apiCpu;
    ctx.stats("api, holding waits").wall += wall;
    ctx.stats("api, holding waits").sampleRss(api.pid);

    const finished = new Map(
      (await sql<{ run_id: string; status: string; fin: number | null }[]>`
        select run_id, status, extract(epoch from finished_at)::float8 * 1000 as fin
          from runs where tenant_id = ${tenant}`).map((r) => [r.run_id, r]),
    );
    const final = report.answers.filter((a) =>
      a.http === 200 && a.status === "succeeded" && a.applied === `wait=${size.waitSeconds}` &&
      finished.get(a.run_id)?.status === "succeeded"
    );
    const failed = report.answers.filter((a) => !final.includes(a)).slice(0, 3);
    check(
      report.answers.length === size.waiters && final.length === size.waiters,
      `wait round ${round}: ${final.length} of ${size.waiters} waiters answered with their ` +
        `succeeded run (first others: ${JSON.stringify(failed)})`,
    );
    const delays = final.map((a) => a.at - finished.get(a.run_id)!.fin!).sort((a, b) => a - b);
    const fins = [...finished.values()].map((r) => r.fin!);
    return {
      round,
      waiters: size.waiters,
      maxSleepMs: size.maxSleepMs,
      waitSeconds: size.waitSeconds,
      answeredFinal: final.length,
      p50: q(delays, 0.5),
      p99: q(delays, 0.99),
      max: delays[delays.length - 1] ?? 0,
      finishSpan: (Math.max(...fins) - Math.min(...fins)) / 1000,
      apiCpu,
      apiCpuOpening: cpuOpened - cpu0,
      wall,
      apiRssStart: rssStart,
      apiRssPeak: rssPeak,
      clientCpu: report.cpuSeconds,
    };
  } finally {
    if (waiters && !waiters.exited()) waiters.kill();
    await worker?.stop();
    await api.stop();
  }
}

/** Every round of the wait section, on a database of its own; `size` only for a smoke run. */
export async function waitSection(ctx: BenchContext, admin: Sql, size: WaitSize = WAIT_SIZE) {
  const { url, sql } = await createDb(ctx, admin, `poimen_bench_${ctx.stamp}_wait`);
  try {
    for (let round = 1; round <= ctx.cfg.rounds; round++) {
      const f = await waitRound(ctx, url, sql, round, size);
      ctx.waiting.push(f);
      log(
        `wait round ${round}: ${f.answeredFinal}/${f.waiters} final; finished → answered ` +
          `p50 ${f.p50.toFixed(0)} p99 ${f.p99.toFixed(0)} max ${f.max.toFixed(0)} ms; ` +
          `api ${f.apiCpu.toFixed(2)} s CPU, peak RSS ${f.apiRssPeak.toFixed(0)} MB`,
      );
    }
  } finally {
    await sql.end();
  }
}

/** The report's part for the wait section: one row per round (none when it did not run). */
export function waitReport(ctx: BenchContext): string[] {
  if (ctx.waiting.length === 0) return [];
  const f0 = ctx.waiting[0];
  return [
    `## Waiting for results (Prefer: wait)`,
    ``,
    `${f0.waiters} runs of sleep@1 (ms spread over 0–${f0.maxSleepMs}), one ` +
    `\`GET /v1/runs/{id}\` with \`Prefer: wait=${f0.waitSeconds}\` held for each by a ` +
    `process of its own (bench/wait_clients.ts), all held by the API before the worker ` +
    `(concurrency ${f0.waiters}) starts. Delay: the run's \`finished_at\` (Postgres \`now()\` ` +
    `of the finishing transaction) to its waiter's whole answer. API CPU over the measurement ` +
    `(opening the waits, holding them, answering), and the part spent opening them.`,
    ``,
    `| round | answered final | finished → answer p50 ms | p99 ms | max ms | finishes over s | ` +
    `API CPU s (opening) | API cores | API CPU µs/waiter | API peak RSS MB (at start) | ` +
    `callers' CPU s |`,
    `|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|`,
    ...ctx.waiting.map((f) =>
      `| ${f.round} | ${f.answeredFinal} of ${f.waiters} | ${f.p50.toFixed(0)} | ` +
      `${f.p99.toFixed(0)} | ${f.max.toFixed(0)} | ${f.finishSpan.toFixed(1)} | ` +
      `${f.apiCpu.toFixed(2)} (${f.apiCpuOpening.toFixed(2)}) | ${
        (f.apiCpu / f.wall).toFixed(2)
      } | ` +
      `${((f.apiCpu * 1e6) / f.waiters).toFixed(0)} | ${f.apiRssPeak.toFixed(0)} ` +
      `(${f.apiRssStart.toFixed(0)}) | ${f.clientCpu.toFixed(2)} |`
    ),
    ``,
  ];
}
