/**
 * `deno task bench`: admission throughput, measured side by side in one run
 * on this machine, and written to bench/out/admission.md. Not a test: it
 * asserts nothing about durations, it reports ratios.
 *
 * Over HTTP, each scenario gets the same closed-loop load (CLIENTS
 * concurrent keep-alive connections, DURATION each, after a warm-up):
 * - baseline: a minimal hono + postgres.js endpoint, one INSERT per request;
 * - poimen (the real API process: auth, validation, outbox event, metrics),
 *   group commit: new runs; replays of existing keys; no dispatch key;
 * - poimen, one statement per admission (ADMISSION_MAX_BATCH=1).
 *
 * The database path alone, in process (CLIENTS concurrent callers, no
 * HTTP): the admission kernel against one raw `INSERT … ON CONFLICT …
 * RETURNING` per call through postgres.js.
 */
import { createPool, type Sql } from "../db/pool.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { hashToken, newToken } from "../api/auth.ts";
import { loadMigrations, migrate } from "../db/migrate.ts";
import { silentLogger } from "../core/log.ts";
import { Admission } from "../admission/admit.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { PROJECT_ROOT, taskArgs } from "../dev/tasks.ts";
import { SECOND } from "../core/time.ts";

const CLIENTS = Number(Deno.env.get("BENCH_CLIENTS") ?? 16);
const DURATION = Number(Deno.env.get("BENCH_SECONDS") ?? 5) * SECOND;
const WARMUP = 1 * SECOND;
const ADMIN_URL = Deno.env.get("BENCH_ADMIN_URL") ??
  "postgres://postgres@127.0.0.1:5432/postgres";

interface Result {
  name: string;
  perSecond: number;
  p50: number;
  p99: number;
  statuses: Record<string, number>;
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
    const ok = await fetch(url).then(async (r) => {
      await r.body?.cancel();
      return r.status < 500;
    }, () => false);
    if (ok) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} not ready`);
}

/** Starts `deno <args>` and waits until `readyUrl` answers. */
async function serve(args: string[], env: Record<string, string>, readyUrl: string) {
  const child = new Deno.Command(Deno.execPath(), {
    args,
    cwd: PROJECT_ROOT,
    env: { LOG_LEVEL: "error", ...env },
    stdin: "null",
    stdout: "null",
    stderr: "inherit",
  }).spawn();
  await waitReady(readyUrl);
  return {
    async stop() {
      child.kill("SIGTERM");
      await child.status;
    },
  };
}

// Run before each scenario: a CHECKPOINT, so that no scenario pays for the
// dirty pages of the one before it (a checkpoint landing inside one scenario
// and not another was the largest source of variance between runs).
let settle: () => Promise<unknown> = () => Promise.resolve();

/**
 * Closed-loop load: CLIENTS callers of `call` until DURATION after a warm-up;
 * `call` returns a status label to count.
 */
async function measure(
  name: string,
  setup: () => unknown,
  call: (ctx: unknown, client: number, i: number) => Promise<string>,
): Promise<Result> {
  await settle();
  const latencies: number[] = [];
  const statuses: Record<string, number> = {};
  const from = performance.now() + WARMUP;
  const end = from + DURATION;
  await Promise.all(Array.from({ length: CLIENTS }, async (_, client) => {
    const ctx = setup();
    try {
      for (let i = 0; performance.now() < end; i++) {
        const t0 = performance.now();
        const status = await call(ctx, client, i);
        if (t0 >= from) {
          latencies.push(performance.now() - t0);
          statuses[status] = (statuses[status] ?? 0) + 1;
        }
      }
    } finally {
      (ctx as { close?: () => void } | undefined)?.close?.();
    }
  }));
  const seconds = (performance.now() - from) / 1000;
  latencies.sort((a, b) => a - b);
  const q = (p: number) =>
    latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] ?? 0;
  return { name, perSecond: latencies.length / seconds, p50: q(0.5), p99: q(0.99), statuses };
}

/** HTTP load on `url` with one keep-alive client per caller. */
function overHttp(name: string, url: string, headers: Record<string, string>, body: Body) {
  return measure(name, () => Deno.createHttpClient({}), async (client, c, i) => {
    const res = await fetch(url, {
      method: "POST",
      headers,
      body: body(c, i),
      client: client as Deno.HttpClient,
    });
    await res.arrayBuffer();
    return String(res.status);
  });
}
type Body = (client: number, i: number) => string;

const runBody = (key: string | null) =>
  JSON.stringify({ workflow_ref: "echo", input: { n: 1 }, ...(key ? { dispatch_key: key } : {}) });

async function scenarios(dbUrl: string, sql: Sql): Promise<Result[]> {
  const results: Result[] = [];
  settle = () => sql`checkpoint`;
  await insertTenant(sql, "bench");
  const token = newToken();
  await insertToken(sql, await hashToken(token), {
    kind: "tenant",
    tenant_id: "bench",
    name: "bench",
  });
  const json = { "content-type": "application/json" };
  const auth = { ...json, authorization: `Bearer ${token}` };

  // The database path alone. Each side gets a pool of its own, as each
  // process would: sharing one made the second scenario's numbers depend on
  // the first (connections left open by a 16-caller load slowed the kernel's
  // two flushes fivefold, an effect we measured but have not explained).
  const rawSql = createPool({ url: dbUrl, max: 10, applicationName: "bench-raw" });
  const kernelSql = createPool({ url: dbUrl, max: 10, applicationName: "bench-kernel" });
  await sql`create table bench_raw (tenant_id text not null, run_id uuid not null,
    dispatch_key text, input jsonb, primary key (tenant_id, run_id))`;
  await sql`create unique index on bench_raw (tenant_id, dispatch_key)
    where dispatch_key is not null`;
  results.push(
    await measure(
      "in process: raw INSERT … ON CONFLICT, one per call",
      () => undefined,
      async (_, c, i) => {
        const rows = await rawSql`
        insert into bench_raw values ('bench', ${crypto.randomUUID()}, ${`raw-${c}-${i}`},
          ${rawSql.json({ n: 1 })})
        on conflict (tenant_id, dispatch_key) where dispatch_key is not null do nothing
        returning run_id`;
        return rows.length ? "created" : "deduplicated";
      },
    ),
  );
  await rawSql.end();
  const kernel = new Admission(kernelSql, builtinRegistry(), { maxBatch: 128, maxConcurrent: 2 });
  const admit = (key: string) => async () => {
    const r = await kernel.admit(
      { workflow_ref: "echo", input: { n: 1 }, dispatch_key: key },
      { tenantId: "bench", source: "bench", entry: "http" },
    );
    return r.created ? "created" : "deduplicated";
  };
  results.push(
    await measure(
      "in process: admission kernel, new runs",
      () => undefined,
      (_, c, i) => admit(`kernel-${c}-${i}`)(),
    ),
  );
  results.push(
    await measure(
      "in process: admission kernel, replays",
      () => undefined,
      (_, c, i) => admit(`kernel-${c}-${i % 50}`)(),
    ),
  );
  await kernelSql.end();

  // Over HTTP.
  const basePort = freePort();
  const base = await serve(["run", "--allow-net", "--allow-env", "bench/minimal_server.ts"], {
    DATABASE_URL: dbUrl,
    PORT: String(basePort),
  }, `http://127.0.0.1:${basePort}/`);
  results.push(
    await overHttp(
      "HTTP: baseline, minimal hono + one INSERT",
      `http://127.0.0.1:${basePort}/v1/runs`,
      json,
      (c, i) => runBody(`base-${c}-${i}`),
    ),
  );
  await base.stop();

  for (const grouped of [true, false]) {
    const port = freePort();
    const api = await serve(taskArgs("api"), {
      DATABASE_URL: dbUrl,
      PORT: String(port),
      ...(grouped ? {} : { ADMISSION_MAX_BATCH: "1", ADMISSION_MAX_CONCURRENT: "8" }),
    }, `http://127.0.0.1:${port}/healthz`);
    const url = `http://127.0.0.1:${port}/v1/runs`;
    if (grouped) {
      results.push(
        await overHttp(
          "HTTP: poimen, group commit, new runs",
          url,
          auth,
          (c, i) => runBody(`group-${c}-${i}`),
        ),
      );
      results.push(
        await overHttp(
          "HTTP: poimen, group commit, replays",
          url,
          auth,
          (c, i) => runBody(`group-${c}-${i % 50}`),
        ),
      );
      results.push(
        await overHttp(
          "HTTP: poimen, group commit, no dispatch key",
          url,
          auth,
          () => runBody(null),
        ),
      );
    } else {
      results.push(
        await overHttp(
          "HTTP: poimen, one statement per admission, new runs",
          url,
          auth,
          (c, i) => runBody(`single-${c}-${i}`),
        ),
      );
    }
    await api.stop();
  }
  return results;
}

async function main() {
  const dbName = `poimen_bench_${Date.now()}`;
  const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "bench" });
  await admin.unsafe(`create database ${dbName}`);
  const url = new URL(ADMIN_URL);
  url.pathname = `/${dbName}`;
  const sql = createPool({ url: url.href, max: 10, applicationName: "bench" });
  let results: Result[];
  try {
    await migrate(sql, await loadMigrations(), silentLogger);
    results = await scenarios(url.href, sql);
  } finally {
    await sql.end();
    await admin.unsafe(`drop database if exists ${dbName} with (force)`);
    await admin.end();
  }

  const ratio = (r: Result, base: Result) => (r.perSecond / base.perSecond).toFixed(2);
  const raw = results.find((r) => r.name.includes("raw INSERT"))!;
  const baseline = results.find((r) => r.name.includes("baseline"))!;
  const cpu = (await Deno.readTextFile("/proc/cpuinfo").catch(() => ""))
    .match(/model name\s*:\s*(.*)/)?.[1] ?? "unknown CPU";
  const pg = await (async () => {
    const a = createPool({ url: ADMIN_URL, max: 1, applicationName: "bench" });
    try {
      const [r] = await a`select version() as v,
        current_setting('fsync') as fsync, current_setting('synchronous_commit') as sc`;
      return `${String(r.v).split(" on ")[0]}, fsync=${r.fsync}, synchronous_commit=${r.sc}`;
    } finally {
      await a.end();
    }
  })();
  const report = [
    `# Admission benchmark`,
    ``,
    `${
      new Date().toISOString()
    } · Deno ${Deno.version.deno} · ${navigator.hardwareConcurrency} cores ` +
    `(${cpu}) · ${pg} on 127.0.0.1 · ${CLIENTS} concurrent callers · ${DURATION / 1000} s per ` +
    `scenario after ${WARMUP / 1000} s warm-up · load generator, API and Postgres share the cores.`,
    ``,
    `× ref: in-process rows against the raw INSERT, HTTP rows against the minimal endpoint.`,
    ``,
    `| scenario | per s | × ref | p50 ms | p99 ms | outcomes |`,
    `|---|---:|---:|---:|---:|---|`,
    ...results.map((r) =>
      `| ${r.name} | ${r.perSecond.toFixed(0)} | ${
        ratio(r, r.name.startsWith("HTTP") ? baseline : raw)
      } | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)} | ${JSON.stringify(r.statuses)} |`
    ),
    ``,
  ].join("\n");
  await Deno.mkdir(`${PROJECT_ROOT}bench/out`, { recursive: true });
  await Deno.writeTextFile(`${PROJECT_ROOT}bench/out/admission.md`, report);
  console.log(report);
}

if (import.meta.main) await main();
