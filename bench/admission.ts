/**
 * `deno task bench`: admission throughput, measured side by side in one run
 * on this machine, and written to bench/out/admission.md. Not a test: it
 * asserts nothing about durations, it reports.
 *
 * Scenarios, each with the same closed-loop HTTP load (CLIENTS concurrent
 * keep-alive connections, DURATION each, after a warm-up):
 * - baseline: a minimal hono + postgres.js endpoint, one INSERT per request;
 * - poimen, group commit (default): the full API (auth, validation, outbox
 *   event, metrics), new runs with unique dispatch keys;
 * - poimen, one statement per admission (ADMISSION_MAX_BATCH=1);
 * - poimen, replays: every request repeats an existing dispatch key;
 * - poimen, no dispatch key.
 */
import { createPool } from "../db/pool.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { hashToken, newToken } from "../api/auth.ts";
import { loadMigrations, migrate } from "../db/migrate.ts";
import { silentLogger } from "../core/log.ts";
import { PROJECT_ROOT, taskArgs } from "../dev/tasks.ts";
import { SECOND } from "../core/time.ts";

const CLIENTS = Number(Deno.env.get("BENCH_CLIENTS") ?? 16);
const DURATION = Number(Deno.env.get("BENCH_SECONDS") ?? 5) * SECOND;
const WARMUP = 1 * SECOND;
const ADMIN_URL = Deno.env.get("BENCH_ADMIN_URL") ?? "postgres://postgres@127.0.0.1:5432/postgres";

interface Result {
  name: string;
  requests: number;
  seconds: number;
  perSecond: number;
  p50: number;
  p99: number;
  statuses: Record<number, number>;
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const p = (l.addr as Deno.NetAddr).port;
  l.close();
  return p;
}

async function waitReady(url: string) {
  const deadline = Date.now() + 30 * SECOND;
  while (Date.now() < deadline) {
    const ok = await fetch(url, { method: "GET" }).then(async (r) => {
      await r.body?.cancel();
      return r.status < 500;
    }, () => false);
    if (ok) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} not ready`);
}

function spawn(args: string[], env: Record<string, string>): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args,
    cwd: PROJECT_ROOT,
    env: { LOG_LEVEL: "error", ...env },
    stdin: "null",
    stdout: "null",
    stderr: "inherit",
  }).spawn();
}

async function load(
  name: string,
  url: string,
  headers: Record<string, string>,
  body: (client: number, i: number) => string,
): Promise<Result> {
  const latencies: number[] = [];
  const statuses: Record<number, number> = {};
  let measuring = false;
  const start = performance.now();
  const end = start + WARMUP + DURATION;
  let measuredFrom = 0;
  setTimeout(() => {
    measuring = true;
    measuredFrom = performance.now();
  }, WARMUP);
  await Promise.all(Array.from({ length: CLIENTS }, async (_, client) => {
    const http = Deno.createHttpClient({});
    try {
      for (let i = 0; performance.now() < end; i++) {
        const t0 = performance.now();
        const res = await fetch(url, {
          method: "POST",
          headers,
          body: body(client, i),
          client: http,
        });
        await res.arrayBuffer();
        if (measuring) {
          latencies.push(performance.now() - t0);
          statuses[res.status] = (statuses[res.status] ?? 0) + 1;
        }
      }
    } finally {
      http.close();
    }
  }));
  const seconds = (performance.now() - measuredFrom) / 1000;
  latencies.sort((a, b) => a - b);
  const q = (p: number) =>
    latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] ?? 0;
  return {
    name,
    requests: latencies.length,
    seconds,
    perSecond: latencies.length / seconds,
    p50: q(0.5),
    p99: q(0.99),
    statuses,
  };
}

async function main() {
  const dbName = `poimen_bench_${Date.now()}`;
  const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "bench" });
  await admin.unsafe(`create database ${dbName}`);
  const url = new URL(ADMIN_URL);
  url.pathname = `/${dbName}`;
  const dbUrl = url.href;
  const sql = createPool({ url: dbUrl, max: 2, applicationName: "bench" });
  const results: Result[] = [];
  const children: Deno.ChildProcess[] = [];
  try {
    await migrate(sql, await loadMigrations(), silentLogger);
    await insertTenant(sql, "bench");
    const token = newToken();
    await insertToken(sql, await hashToken(token), {
      kind: "tenant",
      tenant_id: "bench",
      name: "bench",
    });
    const json = { "content-type": "application/json" };
    const auth = { ...json, authorization: `Bearer ${token}` };
    const run = (key: string | null) =>
      JSON.stringify({
        workflow_ref: "echo",
        input: { n: 1 },
        ...(key ? { dispatch_key: key } : {}),
      });

    // Baseline.
    const basePort = freePort();
    const base = spawn(["run", "--allow-net", "--allow-env", "bench/minimal_server.ts"], {
      DATABASE_URL: dbUrl,
      PORT: String(basePort),
    });
    children.push(base);
    await waitReady(`http://127.0.0.1:${basePort}/`);
    results.push(
      await load(
        "baseline: minimal hono + one INSERT",
        `http://127.0.0.1:${basePort}/v1/runs`,
        json,
        (c, i) => run(`base-${c}-${i}`),
      ),
    );
    base.kill("SIGTERM");
    await base.status;

    for (
      const [label, env] of [
        ["poimen, group commit: new runs", {}],
        ["poimen, one statement per admission: new runs", { ADMISSION_MAX_BATCH: "1" }],
      ] as const
    ) {
      const port = freePort();
      const api = spawn(taskArgs("api"), { DATABASE_URL: dbUrl, PORT: String(port), ...env });
      children.push(api);
      await waitReady(`http://127.0.0.1:${port}/healthz`);
      const target = `http://127.0.0.1:${port}/v1/runs`;
      const tag = Object.keys(env).length ? "single" : "group";
      results.push(await load(label, target, auth, (c, i) => run(`${tag}-${c}-${i}`)));
      if (tag === "group") {
        results.push(
          await load(
            "poimen, group commit: replays of existing keys",
            target,
            auth,
            (c, i) => run(`group-${c}-${i % 50}`),
          ),
        );
        results.push(
          await load("poimen, group commit: no dispatch key", target, auth, () => run(null)),
        );
      }
      api.kill("SIGTERM");
      await api.status;
    }
  } finally {
    for (const c of children) {
      try {
        c.kill("SIGKILL");
      } catch { /* exited */ }
    }
    await sql.end();
    await admin.unsafe(`drop database if exists ${dbName} with (force)`);
    await admin.end();
  }

  const baseline = results[0].perSecond;
  const cpu =
    (await Deno.readTextFile("/proc/cpuinfo").catch(() => "")).match(/model name\s*:\s*(.*)/)
      ?.[1] ??
      "unknown";
  const lines = [
    `# Admission benchmark`,
    ``,
    `${
      new Date().toISOString()
    } · Deno ${Deno.version.deno} · ${navigator.hardwareConcurrency} cores (${cpu}) · ` +
    `Postgres on 127.0.0.1 · ${CLIENTS} concurrent keep-alive connections · ${
      DURATION / 1000
    } s per scenario ` +
    `after ${WARMUP / 1000} s warm-up · load generator in the same machine (shares the cores).`,
    ``,
    `| scenario | req/s | × baseline | p50 ms | p99 ms | statuses |`,
    `|---|---:|---:|---:|---:|---|`,
    ...results.map((r) =>
      `| ${r.name} | ${r.perSecond.toFixed(0)} | ${(r.perSecond / baseline).toFixed(2)} | ${
        r.p50.toFixed(1)
      } | ${r.p99.toFixed(1)} | ${JSON.stringify(r.statuses)} |`
    ),
    ``,
  ];
  const report = lines.join("\n");
  await Deno.mkdir(`${PROJECT_ROOT}bench/out`, { recursive: true });
  await Deno.writeTextFile(`${PROJECT_ROOT}bench/out/admission.md`, report);
  console.log(report);
}

if (import.meta.main) await main();
