/**
 * `deno task bench [-- --quick] [-- --only http,growth,worker,relay]`: poimen side by side with a minimal
 * endpoint, pgbench, pg-boss and graphile-worker, in one run on this
 * machine, written to bench/REPORT.md. Not a test: it asserts nothing about
 * durations; it fails only when a count is wrong (every key exactly once).
 *
 * - HTTP, load from wrk (bench/wrk/admit.lua) at 16 and 64 connections,
 *   rounds alternating A B A B: the minimal endpoint (bench/minimal_server.ts)
 *   and poimen's POST /v1/runs with new keys, replays and no key;
 * - pgbench on the minimal endpoint's statement, same connections;
 * - pg-boss `send` with singletonKey and graphile-worker `addJob` with jobKey,
 *   new and duplicate keys, same number of concurrent callers (Node 22,
 *   bench/queues.mjs);
 * - admission at 0, 100,000 and 1,000,000 existing runs, never analyzed;
 * - worker execution: one poimen worker (concurrency 16) and one
 *   graphile-worker runner (concurrency 16), the same number of queued jobs;
 * - the inbox relay's drain rate, and publish→run and publish→event latency
 *   at a fixed 1,000 messages/s (needs the Kafka broker: `deno task kafka start`);
 * - peak RSS and CPU of every process, Postgres wait events during admission.
 */
import { createPool, type Sql } from "../db/pool.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { hashToken, newToken } from "../api/auth.ts";
import { loadMigrations, migrate } from "../db/migrate.ts";
import { silentLogger } from "../core/log.ts";
import { Admission } from "../admission/admit.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { freePort, PoimenProcess } from "../dev/processes.ts";
import { brokerAddress, brokerAnswers } from "../dev/kafka.ts";
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { createProducer } from "../kafka/producer.ts";
import { createConsumer } from "../kafka/consumer.ts";
import { dispatchTopic, eventsTopic } from "../contracts/topics.ts";
import { delay, SECOND } from "../core/time.ts";
import {
  depVersion,
  ensureQueueDeps,
  ensureWrk,
  findPgbench,
  loadAvg,
  NODE,
  ProcStats,
  QUEUES_SCRIPT,
  sh,
} from "./tools.ts";

const QUICK = Deno.args.includes("--quick");
// `--only worker,relay`: just those sections (http, growth, worker, relay),
// printed and not written to bench/REPORT.md, whose figures must come from one run.
const ONLY = (() => {
  const i = Deno.args.indexOf("--only");
  return i < 0 ? undefined : new Set(Deno.args[i + 1]?.split(",") ?? []);
})();
const wanted = (section: string) => !ONLY || ONLY.has(section);
const CFG = QUICK
  ? {
    secs: 2,
    warm: 1,
    rounds: 1,
    sizes: [0, 20_000],
    workerJobs: 2_000,
    relayDrain: 2_000,
    relaySecs: 3,
  }
  : {
    secs: 8,
    warm: 2,
    rounds: 2,
    sizes: [0, 100_000, 1_000_000],
    workerJobs: 20_000,
    relayDrain: 20_000,
    relaySecs: 10,
  };
const CONNS = [16, 64];
const REPLAY_KEYS = 50;
const ADMIN_URL = Deno.env.get("BENCH_ADMIN_URL") ?? "postgres://postgres@127.0.0.1:5432/postgres";
const LUA = `${PROJECT_ROOT}bench/wrk/admit.lua`;
const STAMP = Date.now().toString(36);

/** One measurement. Rates per second, latencies in ms. */
interface Figure {
  group: string;
  scenario: string;
  conns: number;
  round: number;
  rate: number;
  p50: number;
  p99: number;
  /** Cores the measured process used, and its CPU per operation in µs. */
  cores?: number;
  usPerOp?: number;
}

const figures: Figure[] = [];
const procs = new Map<string, ProcStats>();
const waits = new Map<string, Map<string, number>>();
const notes: string[] = [];
let WRK = "wrk";
let PGBENCH = "pgbench";

function stats(name: string): ProcStats {
  let s = procs.get(name);
  if (!s) procs.set(name, s = new ProcStats(name));
  return s;
}

function log(msg: string) {
  console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${msg}`);
}

/** Fails the bench: a count that is not what exactly-once demands. */
function check(ok: boolean, what: string): void {
  if (!ok) throw new Error(`correctness check failed: ${what}`);
}

function dbUrl(name: string): string {
  const u = new URL(ADMIN_URL);
  u.pathname = `/${name}`;
  return u.href;
}

async function createDb(admin: Sql, name: string): Promise<{ url: string; sql: Sql }> {
  await admin.unsafe(`create database ${name}`);
  const url = dbUrl(name);
  const sql = createPool({ url, max: 4, applicationName: "bench" });
  await migrate(sql, await loadMigrations(), silentLogger);
  return { url, sql };
}

async function tenantToken(sql: Sql, tenant: string, kind: "tenant" | "service" = "tenant") {
  if (kind === "tenant") await insertTenant(sql, tenant);
  const token = newToken();
  await insertToken(sql, await hashToken(token), {
    kind,
    tenant_id: kind === "tenant" ? tenant : null,
    name: kind === "tenant" ? tenant : "relay",
  });
  return token;
}

/** Polls `count` until it stops changing (in-flight work landed). */
async function settled(count: () => Promise<number>): Promise<number> {
  let last = await count();
  for (;;) {
    await delay(250);
    const now = await count();
    if (now === last) return now;
    last = now;
  }
}

async function countWhere(sql: Sql, table: string, prefix: string) {
  const [r] = await sql.unsafe<{ n: number; d: number }[]>(
    `select count(*)::int as n, count(distinct dispatch_key)::int as d from ${table}
      where dispatch_key like $1`,
    [`${prefix}-%`],
  );
  return r;
}

/** Waits until `url` answers (200, or any status when `anyStatus`). */
async function waitHttp(url: string, what: string, anyStatus = false) {
  const deadline = Date.now() + 60 * SECOND;
  while (Date.now() < deadline) {
    const ok = await fetch(url).then(async (r) => {
      await r.body?.cancel();
      return anyStatus || r.status === 200;
    }, () => false);
    if (ok) return;
    await delay(100);
  }
  throw new Error(`${what} not ready at ${url}`);
}

interface WrkResult {
  requests: number;
  duration_us: number;
  non2xx: number;
  connect_errors: number;
  read_errors: number;
  write_errors: number;
  timeouts: number;
  p50_us: number;
  p99_us: number;
}

async function wrk(url: string, conns: number, secs: number, env: Record<string, string>) {
  const out = await sh(WRK, [
    "-t2",
    `-c${conns}`,
    `-d${secs}s`,
    "--timeout",
    "10s",
    "-s",
    LUA,
    url,
  ], { env: { ...Deno.env.toObject(), ...env } });
  const line = out.stdout.split("\n").find((l) => l.startsWith("WRKJSON "));
  if (!line) throw new Error(`wrk printed no summary:\n${out.stdout}\n${out.stderr}`);
  return JSON.parse(line.slice(8)) as WrkResult;
}

/** Samples the API's Postgres sessions (wait event or CPU) every 100 ms while `fn` runs. */
async function sampleWaits<T>(sql: Sql, label: string, app: string, fn: () => Promise<T>) {
  const hist = waits.get(label) ?? new Map<string, number>();
  waits.set(label, hist);
  let running = true;
  const sampler = (async () => {
    while (running) {
      const rows = await sql<{ w: string; n: number }[]>`
        select coalesce(wait_event_type || ':' || wait_event, 'on CPU') as w, count(*)::int as n
          from pg_stat_activity
         where application_name = ${app} and state = 'active'
         group by 1`.catch(() => []);
      hist.set("(samples)", (hist.get("(samples)") ?? 0) + 1);
      for (const r of rows) hist.set(r.w, (hist.get(r.w) ?? 0) + r.n);
      await delay(100);
    }
  })();
  try {
    return await fn();
  } finally {
    running = false;
    await sampler;
  }
}

// ---------------------------------------------------------------- HTTP

interface HttpTarget {
  scenario: string;
  url: string;
  pid: number;
  proc: string;
  token: string;
  mode: "new" | "replay" | "nokey";
  table: "runs" | "bench_minimal";
}

async function measureHttp(sql: Sql, t: HttpTarget, conns: number, round: number) {
  const prefix = `${t.scenario.replace(/\W+/g, "")}-${conns}-${round}-${STAMP}`;
  const env = {
    BENCH_TOKEN: t.token,
    BENCH_MODE: t.mode,
    BENCH_PREFIX: t.mode === "replay" ? `replay-${STAMP}` : prefix,
    BENCH_KEYS: String(REPLAY_KEYS),
  };
  await wrk(t.url, conns, CFG.warm, { ...env, BENCH_PREFIX: `${env.BENCH_PREFIX}w` });
  if (t.mode === "replay") {
    // The key set must exist before replays are measured.
    for (let k = 0; k < REPLAY_KEYS; k++) {
      const res = await fetch(t.url, {
        method: "POST",
        headers: { authorization: `Bearer ${t.token}`, "content-type": "application/json" },
        body: JSON.stringify({
          workflow_ref: "echo",
          input: { n: 1 },
          dispatch_key: `replay-${STAMP}-${k}`,
        }),
      });
      await res.body?.cancel();
    }
  }
  const count = t.mode === "nokey"
    ? async () => {
      const [r] = await sql<{ n: number }[]>`
        select count(*)::int as n from runs where tenant_id = 'bench' and dispatch_key is null`;
      return { n: r.n, d: r.n };
    }
    : () => countWhere(sql, t.table, env.BENCH_PREFIX);
  const before = await settled(async () => (await count()).n);
  const { value: w, cores } = await stats(t.proc).during(
    t.pid,
    () =>
      t.table === "runs"
        ? sampleWaits(
          sql,
          `${t.scenario}, ${conns} conns`,
          "poimen-api",
          () => wrk(t.url, conns, CFG.secs, env),
        )
        : wrk(t.url, conns, CFG.secs, env),
  );
  const after = await settled(async () => (await count()).n);
  const { n, d } = await count();
  const label = `${t.scenario} @${conns} round ${round}`;
  check(w.non2xx === 0, `${label}: ${w.non2xx} non-2xx answers`);
  check(n === d, `${label}: ${n} rows for ${d} keys`);
  const added = after - before;
  if (t.mode === "replay") {
    check(n === REPLAY_KEYS, `${label}: ${n} runs hold the ${REPLAY_KEYS} replayed keys`);
  } else {
    // wrk stops counting at the deadline: up to `conns` answered requests it never saw.
    check(
      added >= w.requests && added <= w.requests + conns,
      `${label}: ${added} rows for ${w.requests} answered requests`,
    );
  }
  const seconds = w.duration_us / 1e6;
  const rate = w.requests / seconds;
  figures.push({
    group: "http",
    scenario: t.scenario,
    conns,
    round,
    rate,
    p50: w.p50_us / 1000,
    p99: w.p99_us / 1000,
    cores,
    usPerOp: (cores * 1e6) / rate,
  });
  log(`${label}: ${rate.toFixed(0)}/s p99 ${(w.p99_us / 1000).toFixed(1)} ms`);
}

async function pgbench(url: string, sql: Sql, conns: number, round: number, tmp: string) {
  const prefix = `pgbench-${conns}-${round}-${STAMP}`;
  const script = `${tmp}/insert.sql`;
  // The minimal endpoint's statement, as pgbench's prepared statement.
  await Deno.writeTextFile(
    script,
    `insert into bench_minimal (tenant_id, run_id, dispatch_key, input)
  values ('bench', gen_random_uuid(), :prefix::text || '-' || :client_id || '-' || gen_random_uuid(),
          '{"n":1}'::jsonb)
  on conflict (tenant_id, dispatch_key) where dispatch_key is not null do nothing
  returning run_id;\n`,
  );
  const u = new URL(url);
  const base = [
    "-n",
    "-M",
    "prepared",
    "-j",
    "2",
    "-c",
    String(conns),
    "-f",
    script,
    "-h",
    u.hostname,
    "-p",
    u.port || "5432",
    "-U",
    decodeURIComponent(u.username),
  ];
  const db = u.pathname.slice(1);
  // pgbench needs a connection per client at once: on a shared server other
  // sessions may leave too few; wait for them a little, then skip with a note.
  for (let attempt = 1;; attempt++) {
    const warm = await sh(
      PGBENCH,
      [...base, "-T", String(CFG.warm), "-D", `prefix=${prefix}w`, db],
      { allowFail: true },
    );
    if (warm.code === 0) break;
    if (!warm.stderr.includes("too many clients")) throw new Error(warm.stderr);
    if (attempt === 6) {
      notes.push(
        `pgbench @${conns} round ${round}: skipped, the server had too few free connections ` +
          `(max_connections, shared with other sessions).`,
      );
      return;
    }
    await delay(5 * SECOND);
  }
  const logPrefix = `${tmp}/pgb-${conns}-${round}`;
  const before = (await countWhere(sql, "bench_minimal", prefix)).n;
  const out = await sh(PGBENCH, [
    ...base,
    "-T",
    String(CFG.secs),
    "-D",
    `prefix=${prefix}`,
    "--log",
    `--log-prefix=${logPrefix}`,
    db,
  ]);
  const processed = Number(/actually processed: (\d+)/.exec(out.stdout)?.[1]);
  const tps = Number(/tps = ([\d.]+) \(without initial connection time\)/.exec(out.stdout)?.[1]);
  const lat: number[] = [];
  for await (const e of Deno.readDir(tmp)) {
    if (!e.name.startsWith(`pgb-${conns}-${round}.`)) continue;
    for (const line of (await Deno.readTextFile(`${tmp}/${e.name}`)).split("\n")) {
      const f = line.split(" ");
      if (f.length > 2) lat.push(Number(f[2]) / 1000);
    }
  }
  lat.sort((a, b) => a - b);
  const { n, d } = await countWhere(sql, "bench_minimal", prefix);
  const label = `pgbench @${conns} round ${round}`;
  check(n === d, `${label}: ${n} rows for ${d} keys`);
  check(
    n - before >= processed && n - before <= processed + conns,
    `${label}: ${n - before} rows for ${processed} transactions`,
  );
  figures.push({
    group: "http",
    scenario: "pgbench, same INSERT (no HTTP)",
    conns,
    round,
    rate: tps,
    p50: q(lat, 0.5),
    p99: q(lat, 0.99),
  });
  log(`${label}: ${tps.toFixed(0)}/s`);
}

function q(sorted: number[], p: number): number {
  return sorted.length === 0
    ? 0
    : sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

async function queueEnqueue(
  url: string,
  sql: Sql,
  lib: "pg-boss" | "graphile",
  mode: "new" | "dup",
  conns: number,
  round: number,
) {
  const prefix = `${lib}-${mode}-${conns}-${round}-${STAMP}`;
  const child = new Deno.Command(NODE, {
    args: [
      QUEUES_SCRIPT,
      "enqueue",
      lib,
      mode,
      String(conns),
      String(CFG.secs),
      prefix,
      String(REPLAY_KEYS),
    ],
    cwd: `${PROJECT_ROOT}bench/.deps`,
    env: { DATABASE_URL: url, BENCH_WARMUP_MS: String(CFG.warm * 1000) },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const name = lib === "pg-boss" ? "pg-boss send (node)" : "graphile-worker addJob (node)";
  const rss = setInterval(() => stats(name).sampleRss(child.pid), 200);
  const out = await child.output();
  clearInterval(rss);
  const dec = new TextDecoder();
  if (out.code !== 0) {
    throw new Error(`queues.mjs ${lib} ${mode} failed:\n${dec.decode(out.stderr)}`);
  }
  const r = JSON.parse(dec.decode(out.stdout).trim().split("\n").pop()!);
  const [c] = lib === "pg-boss"
    ? await sql<{ n: number; d: number }[]>`
      select count(*)::int as n, count(distinct singleton_key)::int as d from pgboss.job
       where name = 'bench' and singleton_key like ${prefix + "-%"}`
    : await sql<{ n: number; d: number }[]>`
      select count(*)::int as n, count(distinct key)::int as d
        from graphile_worker._private_jobs where key like ${prefix + "-%"}`;
  const label = `${lib} ${mode} @${conns} round ${round}`;
  check(c.n === c.d, `${label}: ${c.n} jobs for ${c.d} keys`);
  if (mode === "dup") check(c.n === REPLAY_KEYS, `${label}: ${c.n} jobs for ${REPLAY_KEYS} keys`);
  else check(c.n >= r.ops, `${label}: ${c.n} jobs for ${r.ops} enqueues`);
  if (lib === "pg-boss" && mode === "new") check(r.created === r.ops, `${label}: send refused`);
  figures.push({
    group: "queues",
    scenario: `${
      lib === "pg-boss" ? "pg-boss send, singletonKey" : "graphile-worker addJob, jobKey"
    }, ${mode === "new" ? "new keys" : "duplicates"}`,
    conns,
    round,
    rate: r.rate,
    p50: r.p50_ms,
    p99: r.p99_ms,
  });
  log(`${label}: ${r.rate.toFixed(0)}/s`);
}

async function httpRounds(admin: Sql) {
  const { url, sql } = await createDb(admin, `poimen_bench_${STAMP}`);
  const token = await tenantToken(sql, "bench");
  const tmp = await Deno.makeTempDir({ prefix: "poimen-bench-" });
  try {
    for (let round = 1; round <= CFG.rounds; round++) {
      const minimalPort = freePort();
      const minimal = new Deno.Command(Deno.execPath(), {
        args: ["run", "--allow-net", "--allow-env", "bench/minimal_server.ts"],
        cwd: PROJECT_ROOT,
        env: { DATABASE_URL: url, PORT: String(minimalPort) },
        stdin: "null",
        stdout: "null",
        stderr: "inherit",
      }).spawn();
      const apiPort = freePort();
      const api = new PoimenProcess("api", {
        DATABASE_URL: url,
        PORT: String(apiPort),
        HOST: "127.0.0.1",
        LOG_LEVEL: "error",
      });
      try {
        // It has no GET route: any answer will do.
        await waitHttp(`http://127.0.0.1:${minimalPort}/`, "minimal endpoint", true);
        await waitHttp(`http://127.0.0.1:${apiPort}/readyz`, "api");
        const targets: HttpTarget[] = [
          {
            scenario: "minimal endpoint (hono + one INSERT)",
            url: `http://127.0.0.1:${minimalPort}/v1/runs`,
            pid: minimal.pid,
            proc: "minimal endpoint",
            token: "",
            mode: "new",
            table: "bench_minimal",
          },
          ...(["new", "replay", "nokey"] as const).map((mode) => ({
            scenario: {
              new: "poimen POST /v1/runs, new keys",
              replay: "poimen POST /v1/runs, replays",
              nokey: "poimen POST /v1/runs, no key",
            }[mode],
            url: `http://127.0.0.1:${apiPort}/v1/runs`,
            pid: api.pid,
            proc: "api",
            token,
            mode,
            table: "runs" as const,
          })),
        ];
        for (const conns of CONNS) {
          for (const t of targets) await measureHttp(sql, t, conns, round);
        }
      } finally {
        stats("api").sampleRss(api.pid);
        stats("minimal endpoint").sampleRss(minimal.pid);
        await api.stop();
        try {
          minimal.kill("SIGTERM");
        } catch { /* gone */ }
        await minimal.status;
      }
      for (const conns of CONNS) await pgbench(url, sql, conns, round, tmp);
      for (const conns of CONNS) {
        for (const lib of ["pg-boss", "graphile"] as const) {
          for (const mode of ["new", "dup"] as const) {
            await queueEnqueue(url, sql, lib, mode, conns, round);
          }
        }
      }
    }
    const [dups] = await sql<{ n: number }[]>`
      select count(*)::int as n from (select 1 from runs where dispatch_key is not null
        group by tenant_id, dispatch_key having count(*) > 1) x`;
    check(dups.n === 0, `${dups.n} keys with more than one run`);
  } finally {
    await sql.end();
    await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
}

// ---------------------------------------------------------------- growth

async function growth(admin: Sql) {
  const dbs: { size: number; url: string; sql: Sql; token: string }[] = [];
  for (const size of CFG.sizes) {
    const { url, sql } = await createDb(admin, `poimen_bench_${STAMP}_g${size}`);
    const token = await tenantToken(sql, "bench");
    // Never analyzed: no autovacuum on this table, whatever the server's setting.
    await sql`alter table runs set (autovacuum_enabled = false)`;
    await sql`alter table work_events set (autovacuum_enabled = false)`;
    if (size > 0) {
      log(`growth: inserting ${size} finished runs`);
      await sql`
        insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                          dispatch_key, source, status, attempts, max_attempts, finished_at)
        select 'bench', gen_random_uuid(), 'echo', 'echo', 1, '{"n":1}'::jsonb,
               'old-' || g, 'http:bench', 'succeeded', 1, 3, now()
          from generate_series(1, ${size}::int) g`;
    }
    const [st] = await sql<{ analyzed: boolean }[]>`
      select (last_analyze is not null or last_autoanalyze is not null) as analyzed
        from pg_stat_user_tables where relname = 'runs'`;
    check(!st.analyzed, `growth ${size}: the runs table was analyzed`);
    dbs.push({ size, url, sql, token });
  }
  try {
    for (let round = 1; round <= CFG.rounds; round++) {
      for (const db of dbs) {
        const port = freePort();
        const api = new PoimenProcess("api", {
          DATABASE_URL: db.url,
          PORT: String(port),
          HOST: "127.0.0.1",
          LOG_LEVEL: "error",
        });
        try {
          await waitHttp(`http://127.0.0.1:${port}/readyz`, "api");
          const t: HttpTarget = {
            scenario: `poimen new keys, ${
              db.size.toLocaleString("en")
            } existing runs, no statistics`,
            url: `http://127.0.0.1:${port}/v1/runs`,
            pid: api.pid,
            proc: "api",
            token: db.token,
            mode: "new",
            table: "runs",
          };
          await measureHttp(db.sql, t, 16, round);
          figures[figures.length - 1].group = "growth";
        } finally {
          stats("api").sampleRss(api.pid);
          await api.stop();
        }
      }
    }
  } finally {
    for (const db of dbs) await db.sql.end();
  }
}

// ---------------------------------------------------------------- worker

async function workers(admin: Sql) {
  const { url, sql } = await createDb(admin, `poimen_bench_${STAMP}_w`);
  await insertTenant(sql, "bench");
  try {
    for (let round = 1; round <= CFG.rounds; round++) {
      // poimen: runs admitted through the kernel, then one worker process.
      const kernelSql = createPool({ url, max: 4, applicationName: "bench-admit" });
      const kernel = new Admission(kernelSql, builtinRegistry(), {
        maxBatch: 500,
        maxConcurrent: 2,
      });
      const tenant = `w${round}`;
      await insertTenant(sql, tenant);
      for (let i = 0; i < CFG.workerJobs; i += 2000) {
        await Promise.all(
          Array.from(
            { length: Math.min(2000, CFG.workerJobs - i) },
            (_, j) =>
              kernel.admit({ workflow_ref: "echo", input: { n: i + j } }, {
                tenantId: tenant,
                source: "bench",
                entry: "http",
              }),
          ),
        );
      }
      await kernelSql.end();
      const worker = new PoimenProcess("worker", {
        DATABASE_URL: url,
        WORKER_CONCURRENCY: "16",
        LOG_LEVEL: "error",
      });
      const { value: seconds, cores } = await stats("worker").during(worker.pid, async () => {
        const deadline = Date.now() + 600 * SECOND;
        for (;;) {
          const [r] = await sql<{ n: number }[]>`
            select count(*)::int as n from runs where tenant_id = ${tenant} and status = 'succeeded'`;
          if (r.n >= CFG.workerJobs) break;
          if (worker.exited || Date.now() > deadline) {
            throw new Error(`worker stalled at ${r.n}:\n${worker.logs().join("\n")}`);
          }
          await delay(100);
        }
        const [t] = await sql<{ s: number }[]>`
          select extract(epoch from max(finished_at) - min(started_at))::float8 as s
            from runs where tenant_id = ${tenant}`;
        return t.s;
      });
      await worker.stop();
      const [c] = await sql<{ n: number; once: number }[]>`
        select count(*)::int as n, count(*) filter (where attempts = 1 and status = 'succeeded')::int as once
          from runs where tenant_id = ${tenant}`;
      check(
        c.n === CFG.workerJobs && c.once === CFG.workerJobs,
        `worker round ${round}: ${c.once} of ${c.n} runs succeeded on their first attempt`,
      );
      figures.push({
        group: "worker",
        scenario: "poimen worker, concurrency 16, echo runs",
        conns: 16,
        round,
        rate: CFG.workerJobs / seconds,
        p50: 0,
        p99: 0,
        cores,
      });
      log(`poimen worker round ${round}: ${(CFG.workerJobs / seconds).toFixed(0)}/s`);

      // graphile-worker: the same number of no-op jobs, one runner process.
      const prefix = `gwork-${round}-${STAMP}`;
      const child = new Deno.Command(NODE, {
        args: [
          QUEUES_SCRIPT,
          "work",
          "graphile",
          "16",
          String(CFG.workerJobs),
          prefix,
        ],
        cwd: `${PROJECT_ROOT}bench/.deps`,
        env: { DATABASE_URL: url },
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      const gstats = stats("graphile-worker runner (node)");
      const rss = setInterval(() => gstats.sampleRss(child.pid), 200);
      const out = await child.output();
      clearInterval(rss);
      const dec = new TextDecoder();
      if (out.code !== 0) throw new Error(`graphile work failed:\n${dec.decode(out.stderr)}`);
      const r = JSON.parse(dec.decode(out.stdout).trim().split("\n").pop()!);
      check(
        r.executed === CFG.workerJobs,
        `graphile round ${round}: ${r.executed} executions for ${CFG.workerJobs} jobs`,
      );
      figures.push({
        group: "worker",
        scenario: "graphile-worker, concurrency 16, no-op jobs",
        conns: 16,
        round,
        rate: r.rate,
        p50: 0,
        p99: 0,
      });
      log(`graphile-worker round ${round}: ${r.rate.toFixed(0)}/s`);
    }
  } finally {
    await sql.end();
  }
}

// ---------------------------------------------------------------- relay

async function relay(admin: Sql): Promise<void> {
  const broker = brokerAddress();
  if (!(await brokerAnswers(broker))) {
    notes.push(
      `relay: skipped, no Kafka broker at ${broker} (start one with \`deno task kafka start\`).`,
    );
    return;
  }
  const { url, sql } = await createDb(admin, `poimen_bench_${STAMP}_r`);
  const tenant = `bench-${STAMP}`;
  await insertTenant(sql, tenant);
  const serviceToken = await tenantToken(sql, tenant, "service");
  const kafka = { brokers: [broker], clientId: "poimen-bench" };
  const adminK = createAdmin(kafka);
  await ensureTenantTopics(adminK, tenant, {
    partitions: 3,
    replicationFactor: 1,
    retentionMs: 3_600_000,
  });
  await adminK.close();
  const producer = createProducer(kafka);
  const port = freePort();
  const env = { DATABASE_URL: url, KAFKA_BROKERS: broker, LOG_LEVEL: "error" };
  const api = new PoimenProcess("api", { ...env, PORT: String(port), HOST: "127.0.0.1" });
  const outbox = new PoimenProcess("outbox", env);
  const startRelay = () =>
    new PoimenProcess("relay", {
      KAFKA_BROKERS: broker,
      LOG_LEVEL: "error",
      API_URL: `http://127.0.0.1:${port}`,
      RELAY_TOKEN: serviceToken,
      RELAY_GROUP_ID: `bench-${STAMP}`,
      RELAY_TENANT_PATTERN: tenant, // only [a-z0-9-]: matches itself
      RELAY_TOPIC_REFRESH_MS: "500",
    });
  const msg = (key: string) => ({
    topic: dispatchTopic(tenant),
    key: `${tenant}/${key}`,
    value: JSON.stringify({ workflow_ref: "echo", input: { n: 1 }, dispatch_key: key }),
  });
  const runCount = async (prefix: string) => (await countWhere(sql, "runs", prefix));
  let relayProc: PoimenProcess | undefined;
  try {
    await waitHttp(`http://127.0.0.1:${port}/readyz`, "api");
    // Drain: messages published first, then the relay started on them.
    const drain = `drain-${STAMP}`;
    for (let i = 0; i < CFG.relayDrain; i += 500) {
      await producer.send(
        Array.from(
          { length: Math.min(500, CFG.relayDrain - i) },
          (_, j) => msg(`${drain}-${i + j}`),
        ),
      );
    }
    relayProc = startRelay();
    const drained = await stats("relay").during(relayProc.pid, async () => {
      const deadline = Date.now() + 600 * SECOND;
      while ((await runCount(drain)).n < CFG.relayDrain) {
        if (relayProc!.exited || Date.now() > deadline) {
          throw new Error(`relay stalled:\n${relayProc!.logs().join("\n")}`);
        }
        await delay(100);
      }
      const [t] = await sql<{ s: number }[]>`
        select extract(epoch from max(created_at) - min(created_at))::float8 as s
          from runs where tenant_id = ${tenant} and dispatch_key like ${drain + "-%"}`;
      return t.s;
    });
    const dc = await runCount(drain);
    check(
      dc.n === CFG.relayDrain && dc.d === CFG.relayDrain,
      `relay drain: ${dc.n} runs for ${CFG.relayDrain} messages`,
    );
    figures.push({
      group: "relay",
      scenario: "relay drain, pre-published dispatch messages → runs",
      conns: 0,
      round: 1,
      rate: CFG.relayDrain / drained.value,
      p50: 0,
      p99: 0,
      cores: drained.cores,
    });
    log(`relay drain: ${(CFG.relayDrain / drained.value).toFixed(0)}/s`);

    // Latency at a fixed 1,000 messages/s: 10 messages every 10 ms, once the
    // outbox has shipped the drain's events (it competes for the same cores).
    const backlogDeadline = Date.now() + 120 * SECOND;
    while (
      (await sql<{ n: number }[]>`
        select count(*)::int as n from work_events where published_at is null`)[0].n > 0
    ) {
      if (Date.now() > backlogDeadline) {
        throw new Error("the outbox did not ship the drain's events");
      }
      await delay(200);
    }
    const live = `live-${STAMP}`;
    const sent = new Map<string, number>();
    const eventAt = new Map<string, number>();
    const consumer = createConsumer({
      ...kafka,
      groupId: `bench-events-${STAMP}`,
      topics: [eventsTopic(tenant)],
      startFrom: "latest",
      maxWaitMs: 10,
    });
    const consuming = (async () => {
      for await (const m of consumer) {
        const v = JSON.parse(new TextDecoder().decode(m.value));
        if (v.type === "run.admitted" && typeof v.dispatch_key === "string") {
          if (!eventAt.has(v.dispatch_key)) eventAt.set(v.dispatch_key, Date.now());
        }
      }
    })();
    await delay(3 * SECOND); // the consumer joins its group before the first publish
    const total = CFG.relaySecs * 1000;
    const t0 = performance.now();
    const sends: Promise<unknown>[] = [];
    for (let i = 0; i < total; i += 10) {
      const due = t0 + i;
      const wait = due - performance.now();
      if (wait > 0) await delay(wait);
      const batch = Array.from({ length: 10 }, (_, j) => `${live}-${i + j}`);
      const at = Date.now();
      for (const k of batch) sent.set(k, at);
      sends.push(producer.send(batch.map(msg)));
    }
    await Promise.all(sends);
    const publishSecs = (performance.now() - t0) / 1000;
    const deadline = Date.now() + 120 * SECOND;
    while ((await runCount(live)).n < total || eventAt.size < total) {
      if (Date.now() > deadline) {
        throw new Error(`live: ${(await runCount(live)).n} runs, ${eventAt.size} events`);
      }
      await delay(200);
    }
    await consumer.close();
    await consuming.catch(() => {});
    const lc = await runCount(live);
    check(lc.n === total && lc.d === total, `relay live: ${lc.n} runs for ${total} messages`);
    const rows = await sql<{ k: string; at: number }[]>`
      select dispatch_key as k, extract(epoch from created_at)::float8 * 1000 as at
        from runs where tenant_id = ${tenant} and dispatch_key like ${live + "-%"}`;
    const toRun = rows.map((r) => r.at - sent.get(r.k)!).sort((a, b) => a - b);
    const toEvent = [...eventAt].map(([k, at]) => at - sent.get(k)!).sort((a, b) => a - b);
    figures.push({
      group: "relay",
      scenario: `publish → run (created_at), ${(total / publishSecs).toFixed(0)} msg/s`,
      conns: 0,
      round: 1,
      rate: total / publishSecs,
      p50: q(toRun, 0.5),
      p99: q(toRun, 0.99),
    });
    figures.push({
      group: "relay",
      scenario: `publish → run.admitted consumed from .events, ${
        (total / publishSecs).toFixed(0)
      } msg/s`,
      conns: 0,
      round: 1,
      rate: total / publishSecs,
      p50: q(toEvent, 0.5),
      p99: q(toEvent, 0.99),
    });
    log(
      `relay live: run p99 ${q(toRun, 0.99).toFixed(0)} ms, event p99 ${
        q(toEvent, 0.99).toFixed(0)
      } ms`,
    );
  } finally {
    await producer.close().catch(() => {});
    if (relayProc) {
      stats("relay").sampleRss(relayProc.pid);
      await relayProc.stop();
    }
    stats("outbox").sampleRss(outbox.pid);
    stats("api").sampleRss(api.pid);
    await outbox.stop();
    await api.stop();
    await sql.end();
  }
}

// ---------------------------------------------------------------- report

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0
    ? NaN
    : s.length % 2
    ? s[(s.length - 1) / 2]
    : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

interface Row {
  group: string;
  scenario: string;
  conns: number;
  rate: number;
  rates: number[];
  p50: number;
  p99: number;
  cores?: number;
  usPerOp?: number;
}

function aggregate(): Row[] {
  const rows = new Map<string, Row & { all: Figure[] }>();
  for (const f of figures) {
    const key = `${f.group}|${f.scenario}|${f.conns}`;
    const r = rows.get(key) ?? { ...f, rates: [], all: [] };
    r.all.push(f);
    rows.set(key, r);
  }
  return [...rows.values()].map((r) => ({
    group: r.group,
    scenario: r.scenario,
    conns: r.conns,
    rate: median(r.all.map((f) => f.rate)),
    rates: r.all.map((f) => f.rate),
    p50: median(r.all.map((f) => f.p50)),
    p99: median(r.all.map((f) => f.p99)),
    cores: r.all[0].cores === undefined ? undefined : median(r.all.map((f) => f.cores!)),
    usPerOp: r.all[0].usPerOp === undefined ? undefined : median(r.all.map((f) => f.usPerOp!)),
  }));
}

const fmt = (n: number | undefined, digits = 0) =>
  n === undefined || Number.isNaN(n) ? "—" : n.toFixed(digits);

async function report(started: { at: Date; load: string }, versions: Record<string, string>) {
  const rows = aggregate();
  const find = (scenario: string, conns: number) =>
    rows.find((r) => r.scenario.startsWith(scenario) && r.conns === conns);
  const ratio = (a: Row | undefined, b: Row | undefined) => a && b ? a.rate / b.rate : NaN;
  const targets: [string, number, string, boolean][] = [];
  const target = (what: string, value: number, goal: number, shown = value.toFixed(2)) =>
    targets.push([what, value, `${shown} (target ≥ ${goal})`, value >= goal]);
  const targetMax = (what: string, value: number, goal: number, unit: string) =>
    targets.push([what, value, `${value.toFixed(1)} ${unit} (target ≤ ${goal})`, value <= goal]);
  for (const c of CONNS) {
    const mini = find("minimal endpoint", c);
    const nw = find("poimen POST /v1/runs, new keys", c);
    target(`admission new keys ÷ minimal endpoint, ${c} conns`, ratio(nw, mini), 1.0);
    target(
      `replays ÷ new keys, ${c} conns`,
      ratio(find("poimen POST /v1/runs, replays", c), nw),
      1.2,
    );
    target(
      `new keys ÷ pg-boss send, ${c} callers`,
      ratio(nw, find("pg-boss send, singletonKey, new", c)),
      2,
    );
    target(
      `new keys ÷ graphile-worker addJob, ${c} callers`,
      ratio(nw, find("graphile-worker addJob, jobKey, new", c)),
      2,
    );
    target(
      `replays ÷ pg-boss send (duplicates), ${c} callers`,
      ratio(find("poimen POST /v1/runs, replays", c), find("pg-boss send, singletonKey, dup", c)),
      2,
    );
    target(
      `replays ÷ graphile-worker addJob (duplicates), ${c} callers`,
      ratio(
        find("poimen POST /v1/runs, replays", c),
        find("graphile-worker addJob, jobKey, dup", c),
      ),
      2,
    );
  }
  const nw16 = find("poimen POST /v1/runs, new keys", 16);
  if (nw16) targetMax("admission new keys p99, 16 conns", nw16.p99, 10, "ms");
  const growthRows = rows.filter((r) => r.group === "growth");
  if (growthRows.length > 1) {
    const last = growthRows[growthRows.length - 1];
    target(
      `admission at ${last.scenario.match(/[\d,]+ existing/)?.[0]} runs ÷ empty table`,
      last.rate / growthRows[0].rate,
      0.9,
    );
  }
  const pw = rows.find((r) => r.scenario.startsWith("poimen worker"));
  const gw = rows.find((r) => r.scenario.startsWith("graphile-worker, concurrency"));
  if (pw && gw) target("poimen worker ÷ graphile-worker jobs/s", pw.rate / gw.rate, 1.5);
  const drain = rows.find((r) => r.scenario.startsWith("relay drain"));
  const nw64 = find("poimen POST /v1/runs, new keys", 64);
  if (drain && nw64) {
    target("relay drain ÷ direct HTTP admission (new keys, 64 conns)", drain.rate / nw64.rate, 0.8);
  }
  const toRun = rows.find((r) => r.scenario.startsWith("publish → run ("));
  const toEvent = rows.find((r) => r.scenario.startsWith("publish → run.admitted"));
  if (toRun) targetMax("publish → run p99", toRun.p99, 50, "ms");
  if (toEvent) targetMax("publish → run.admitted event p99", toEvent.p99, 100, "ms");
  for (const name of ["api", "relay", "worker", "outbox"]) {
    const p = procs.get(name);
    if (p && p.peakMb > 0) targetMax(`peak RSS ${name}`, p.peakMb, 150, "MB");
  }

  const cpu = (await sh("cat", ["/proc/cpuinfo"], { allowFail: true })).stdout
    .match(/model name\s*:\s*(.*)/)?.[1] ?? "unknown CPU";
  const table = (group: string, withConns = true) => {
    const list = rows.filter((r) => r.group === group);
    const head = `| scenario |${
      withConns ? " conns |" : ""
    } per s (median) | rounds | p50 ms | p99 ms | process cores | CPU µs/op |`;
    const sep = `|---|${withConns ? "---:|" : ""}---:|---|---:|---:|---:|---:|`;
    return [
      head,
      sep,
      ...list.map((r) =>
        `| ${r.scenario} |${withConns ? ` ${r.conns} |` : ""} ${fmt(r.rate)} | ${
          r.rates.map((x) => x.toFixed(0)).join(" / ")
        } | ${r.p50 ? fmt(r.p50, 1) : "—"} | ${r.p99 ? fmt(r.p99, 1) : "—"} | ${
          fmt(r.cores, 2)
        } | ${fmt(r.usPerOp)} |`
      ),
    ].join("\n");
  };
  const waitTable = [...waits].filter(([label]) => label.includes("new keys")).map(
    ([label, hist]) => {
      const samples = hist.get("(samples)") ?? 1;
      const list = [...hist].filter(([k]) => k !== "(samples)").sort((a, b) => b[1] - a[1]);
      return `- ${label}: ${
        list.slice(0, 6).map(([k, n]) => `${k} ${(n / samples).toFixed(2)}`).join(", ") ||
        "no active session sampled"
      } (mean active API sessions per sample, ${samples} samples)`;
    },
  );
  const lines = [
    `# poimen benchmark`,
    ``,
    `\`deno task bench${QUICK ? " -- --quick" : ""}\` · ${started.at.toISOString()} → ${
      new Date().toISOString()
    }`,
    ``,
    `Machine: ${navigator.hardwareConcurrency} cores (${cpu}), shared: load generator, every ` +
    `process and Postgres run on the same cores. Load average (1, 5, 15 min) at start ` +
    `${started.load}, at end ${loadAvg()}${
      Number(started.load.split(" ")[0]) > navigator.hardwareConcurrency
        ? " — other work was running: absolute figures are low and noisy; the ratios, from " +
          "alternating rounds, are what to read"
        : ""
    }.`,
    ``,
    `Versions: ${Object.entries(versions).map(([k, v]) => `${k} ${v}`).join(" · ")}.`,
    ``,
    `Method: ${CFG.secs} s per measurement after ${CFG.warm} s of warm-up, ${CFG.rounds} ` +
    `round(s), scenarios alternating within each round (A B A B…); the figure is the median ` +
    `of the rounds, each round's shown. HTTP load from wrk (2 threads, bench/wrk/admit.lua: a ` +
    `unique key per request from thread id and counter, or a fixed set of ${REPLAY_KEYS} keys ` +
    `for replays). pg-boss and graphile-worker run in process under Node, N concurrent ` +
    `callers = the connections column. Correctness is checked after every scenario: every key ` +
    `exactly once (rows per key, rows against answered requests); a wrong count fails the bench.`,
    ``,
    `## Targets (issue 12)`,
    ``,
    `| target | measured | met |`,
    `|---|---|---|`,
    ...targets.map(([what, , shown, ok]) => `| ${what} | ${shown} | ${ok ? "yes" : "**no**"} |`),
    ``,
    `## Admission over HTTP, and the same statement without HTTP`,
    ``,
    table("http"),
    ``,
    `## Enqueue with keys: pg-boss and graphile-worker`,
    ``,
    table("queues"),
    ``,
    `## Admission as the table grows, never analyzed`,
    ``,
    table("growth"),
    ``,
    `## Worker execution`,
    ``,
    table("worker", false),
    ``,
    `## Inbox relay`,
    ``,
    table("relay", false),
    ``,
    `## Processes: peak RSS and CPU`,
    ``,
    `| process | peak RSS MB | CPU s while measured | cores while measured |`,
    `|---|---:|---:|---:|`,
    ...[...procs.values()].map((p) =>
      `| ${p.name} | ${fmt(p.peakMb)} | ${p.wall ? fmt(p.cpu, 1) : "—"} | ${
        p.wall ? fmt(p.cpu / p.wall, 2) : "—"
      } |`
    ),
    ``,
    `## Postgres wait events during admission (sampled from pg_stat_activity)`,
    ``,
    ...waitTable,
    ``,
    ...(notes.length ? ["## Notes", "", ...notes.map((n) => `- ${n}`), ""] : []),
  ];
  return lines.join("\n");
}

async function main() {
  const started = { at: new Date(), load: loadAvg() };
  log(`${QUICK ? "quick" : "full"} run; load average ${started.load}`);
  WRK = await ensureWrk();
  PGBENCH = await findPgbench();
  const nodeVersion = await ensureQueueDeps();
  const admin = createPool({ url: ADMIN_URL, max: 2, applicationName: "bench" });
  const [pg] = await admin<{ v: string; fsync: string; sc: string }[]>`
    select version() as v, current_setting('fsync') as fsync,
           current_setting('synchronous_commit') as sc`;
  const versions: Record<string, string> = {
    Deno: Deno.version.deno,
    PostgreSQL: `${String(pg.v).split(" on ")[0]} (fsync=${pg.fsync}, synchronous_commit=${pg.sc})`,
    wrk: (await sh(WRK, ["-v"], { allowFail: true })).stdout.split("\n")[0].trim(),
    pgbench: (await sh(PGBENCH, ["--version"])).stdout.trim(),
    Node: nodeVersion,
    "pg-boss": await depVersion("pg-boss"),
    "graphile-worker": await depVersion("graphile-worker"),
  };
  const dbs = () =>
    admin<{ datname: string }[]>`
      select datname from pg_database where datname like ${`poimen_bench_${STAMP}%`}`;
  try {
    if (wanted("http")) {
      log("HTTP, pgbench and enqueue rounds");
      await httpRounds(admin);
    }
    if (wanted("growth")) {
      log("admission as the table grows");
      await growth(admin);
    }
    if (wanted("worker")) {
      log("worker execution");
      await workers(admin);
    }
    if (wanted("relay")) {
      log("relay");
      await relay(admin);
    }
    const text = await report(started, versions);
    if (!ONLY) await Deno.writeTextFile(`${PROJECT_ROOT}bench/REPORT.md`, text);
    console.log(text);
  } finally {
    for (const { datname } of await dbs()) {
      await admin.unsafe(`drop database if exists ${datname} with (force)`);
    }
    await admin.end();
  }
}

if (import.meta.main) await main();
