/**
 * `deno task bench:relay [-- --messages N --rounds R --other DIR --live]`:
 * the inbox relay's drain rate alone, A/B against another checkout of the
 * project (e.g. `git worktree add /tmp/relay_old <commit>`), rounds
 * alternating. Each round and variant gets a fresh tenant: N messages are
 * published to its dispatch topic first, then that variant's relay is
 * started against one shared API (this checkout's) and timed until every
 * run exists. Prints the rate (messages over the span of the runs'
 * created_at, and over the wall time from the relay's start), the relay's
 * CPU, peak RSS and how often it paused a partition or re-subscribed.
 * With `--live`, also publish→run latency at 1,000 messages/s.
 */
import { z } from "zod";
import type { CommandSpec } from "../core/command_line.ts";
import { createPool } from "../db/pool.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { loadMigrations, migrate } from "../db/migrate.ts";
import { registerVersions } from "../db/catalog.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { silentLogger } from "../core/log.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { freePort, PoimenProcess } from "../dev/processes.ts";
import { brokerAddress } from "../dev/kafka.ts";
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { createProducer } from "../kafka/producer.ts";
import { dispatchTopic } from "../contracts/topics.ts";
import { delay, SECOND } from "../core/time.ts";
import { cpuSeconds, loadAvg, peakRssMb, sh } from "./tools.ts";
import { adminUrl, benchCommandLine, BenchEnv, exitUsage } from "./bench_command_line.ts";

const COMMAND = {
  name: "bench:relay",
  synopsis: "[--messages N] [--rounds R] [--other DIR] [--live] [--outbox] [--http]",
  description: `
The inbox relay's drain rate alone, A/B against another checkout of the
project (e.g. git worktree add /tmp/relay_old <commit>), rounds alternating.
Each round and variant gets a fresh tenant: N messages are published to its
dispatch topic, then that variant's relay is started against one shared API
(this checkout's) and timed until every run exists. Prints, on stderr, the
rate, the relay's CPU, peak RSS and how often it paused a partition or
re-subscribed. Needs the Kafka broker at 127.0.0.1:$KAFKA_PORT (default 9092;
deno task kafka start). RELAY_DENO_ARGS: extra deno flags for the relays (e.g.
--v8-flags=--prof); every other RELAY_* variable is passed on to them as set.`,
  flags: {
    messages: {
      type: "string",
      valueName: "N",
      description: "messages per round and variant (default 20000)",
    },
    rounds: { type: "string", valueName: "R", description: "rounds (default 2)" },
    other: {
      type: "string",
      valueName: "DIR",
      description: "another checkout whose relay is measured against this one's",
    },
    live: { type: "boolean", description: "also publish→run latency at 1,000 messages/s" },
    outbox: {
      type: "boolean",
      description: "run the outbox meanwhile, shipping each admission's event, as the bench does",
    },
    http: {
      type: "boolean",
      description: "each round, first direct HTTP admission (wrk, 64 connections, new keys, 8 s)",
    },
    "log-level": {
      type: "string",
      valueName: "LEVEL",
      description: "the relays' LOG_LEVEL (default info)",
    },
  },
  env: BenchEnv.extend({
    RELAY_DENO_ARGS: z.string().optional(),
  }),
} satisfies CommandSpec;

const { flags } = benchCommandLine(COMMAND, Deno.args);
const args = {
  messages: flags.messages ?? "20000",
  rounds: flags.rounds ?? "2",
  other: flags.other,
  live: flags.live ?? false,
  outbox: flags.outbox ?? false,
  http: flags.http ?? false,
  "log-level": flags["log-level"] ?? "info",
};
const N = Number(args.messages);
const ROUNDS = Number(args.rounds);
for (const [name, n] of [["messages", N], ["rounds", ROUNDS]] as const) {
  if (!Number.isInteger(n) || n < 1) exitUsage(COMMAND, `--${name} must be a whole number ≥ 1`);
}
const ADMIN_URL = adminUrl();
const STAMP = Date.now().toString(36);
const broker = brokerAddress();
const variants: { name: string; root: string }[] = [{ name: "this", root: PROJECT_ROOT }];
if (args.other) variants.push({ name: "other", root: args.other.replace(/\/?$/, "/") });

function log(msg: string) {
  console.error(`[relay-bench ${new Date().toISOString().slice(11, 19)}] ${msg}`);
}

const admin = createPool({ url: ADMIN_URL, max: 2, applicationName: "bench" });
const dbName = `poimen_bench_${STAMP}_relay`;
await admin.unsafe(`create database ${dbName}`);
const u = new URL(ADMIN_URL);
u.pathname = `/${dbName}`;
const url = u.href;
const sql = createPool({ url, max: 4, applicationName: "bench" });
await migrate(sql, loadMigrations(), silentLogger);
// Migrating registers no workflow: the built-ins, as `init --builtins` does.
await registerVersions(sql, builtinRegistry().catalogVersions(), "bench");
const token = newToken();
await insertToken(sql, await hashToken(token), { kind: "service", tenant_id: null, name: "relay" });
const port = freePort();
const api = new PoimenProcess("api", {
  DATABASE_URL: url,
  KAFKA_BROKERS: broker,
  LOG_LEVEL: "error",
  PORT: String(port),
  HOST: "127.0.0.1",
});
// As in `deno task bench`: the outbox ships each admission's event meanwhile.
const outbox = args.outbox
  ? new PoimenProcess("outbox", { DATABASE_URL: url, KAFKA_BROKERS: broker, LOG_LEVEL: "error" })
  : undefined;
const kafka = { brokers: [broker], clientId: "poimen-relay-bench" };
const kadmin = createAdmin(kafka);
const producer = createProducer(kafka);

async function count(tenant: string): Promise<number> {
  const [r] = await sql<
    { n: number }[]
  >`select count(*)::int as n from runs where tenant_id = ${tenant}`;
  return r.n;
}

function spawnRelay(root: string, tenant: string, logFile: string) {
  const metricsPort = freePort();
  const child = new Deno.Command(Deno.execPath(), {
    // RELAY_DENO_ARGS: extra flags, e.g. --v8-flags=--prof to profile.
    args: ["run", "-A", ...(Deno.env.get("RELAY_DENO_ARGS")?.split(" ") ?? []), "main.ts", "relay"],
    cwd: root,
    env: {
      NO_COLOR: "1",
      KAFKA_BROKERS: broker,
      LOG_LEVEL: args["log-level"]!,
      API_URL: `http://127.0.0.1:${port}`,
      RELAY_TOKEN: token,
      RELAY_GROUP_ID: `rb-${tenant}`,
      RELAY_TENANT_PATTERN: tenant,
      RELAY_TOPIC_REFRESH_MS: "500",
      RELAY_METRICS_PORT: String(metricsPort),
      // Tuning to try, passed on as given (RELAY_MAX_IN_FLIGHT=…).
      ...Object.fromEntries(
        Object.entries(Deno.env.toObject()).filter(([k]) =>
          k.startsWith("RELAY_") && k !== "RELAY_DENO_ARGS"
        ),
      ),
    },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const file = Deno.openSync(logFile, { write: true, create: true, truncate: true });
  const w1 = child.stdout.pipeTo(file.writable, { preventClose: true });
  const w2 = child.stderr.pipeTo(new WritableStream({ write: (c) => void file.writeSync(c) }));
  return {
    child,
    async stop() {
      try {
        child.kill("SIGTERM");
      } catch { /* gone */ }
      await child.status;
      await Promise.allSettled([w1, w2]);
      file.close();
    },
  };
}

async function drainRound(round: number, v: { name: string; root: string }) {
  const tenant = `rb-${STAMP}-${round}-${v.name}`;
  await insertTenant(sql, tenant);
  await ensureTenantTopics(kadmin, tenant, {
    partitions: 3,
    replicationFactor: 1,
    retentionMs: 3_600_000,
  });
  for (let i = 0; i < N; i += 500) {
    await producer.send(
      Array.from({ length: Math.min(500, N - i) }, (_, j) => ({
        topic: dispatchTopic(tenant),
        key: `${tenant}/${i + j}`,
        value: JSON.stringify({
          workflow_ref: "echo",
          input: { n: 1 },
          dispatch_key: `d-${i + j}`,
        }),
      })),
    );
  }
  const logFile = `/tmp/relay_bench_${STAMP}_${round}_${v.name}.log`;
  const t0 = performance.now();
  const relay = spawnRelay(v.root, tenant, logFile);
  const pid = relay.child.pid;
  let exited = false;
  void relay.child.status.then(() => (exited = true));
  let cpu0 = 0;
  let rss = 0;
  try {
    const deadline = Date.now() + 600 * SECOND;
    while ((await count(tenant)) < N) {
      rss = Math.max(rss, peakRssMb(pid));
      if (exited || Date.now() > deadline) throw new Error(`stalled, see ${logFile}`);
      await delay(100);
    }
    cpu0 = cpuSeconds(pid);
    rss = Math.max(rss, peakRssMb(pid));
  } finally {
    await relay.stop();
  }
  const wall = (performance.now() - t0) / 1000;
  const [t] = await sql<{ s: number }[]>`
    select extract(epoch from max(created_at) - min(created_at))::float8 as s
      from runs where tenant_id = ${tenant}`;
  const text = await Deno.readTextFile(logFile);
  const pauses = text.split("partition paused").length - 1;
  const subs = text.split("kafka consumer subscribed").length - 1;
  return {
    variant: v.name,
    round,
    rate: N / t.s,
    wallRate: N / wall,
    cores: cpu0 / wall,
    rss,
    pauses,
    subs,
    logFile,
  };
}

/** Direct HTTP admission, new keys, 64 connections from wrk, 8 s: the rate the relay is held to. */
async function httpRound(round: number) {
  const tenant = `rb-${STAMP}-${round}-http`;
  await insertTenant(sql, tenant);
  const t = newToken();
  await insertToken(sql, await hashToken(t), { kind: "tenant", tenant_id: tenant, name: tenant });
  const out = await sh("wrk", [
    "-t2",
    "-c64",
    "-d8s",
    "--timeout",
    "10s",
    "-s",
    `${PROJECT_ROOT}bench/wrk/admit.lua`,
    `http://127.0.0.1:${port}`,
  ], {
    env: { ...Deno.env.toObject(), BENCH_TOKEN: t, BENCH_MODE: "new", BENCH_PREFIX: tenant },
  });
  const line = out.stdout.split("\n").find((l) => l.startsWith("WRKJSON "));
  if (!line) throw new Error(`wrk printed no summary:\n${out.stdout}\n${out.stderr}`);
  const r = JSON.parse(line.slice(8)) as { requests: number; duration_us: number; non2xx: number };
  return (r.requests - r.non2xx) / (r.duration_us / 1e6);
}

async function liveRound(round: number, v: { name: string; root: string }) {
  const tenant = `rb-${STAMP}-${round}-${v.name}-live`;
  await insertTenant(sql, tenant);
  await ensureTenantTopics(kadmin, tenant, {
    partitions: 3,
    replicationFactor: 1,
    retentionMs: 3_600_000,
  });
  const logFile = `/tmp/relay_bench_${STAMP}_${round}_${v.name}_live.log`;
  const relay = spawnRelay(v.root, tenant, logFile);
  try {
    // Joined once a first message has gone through.
    await producer.send([{
      topic: dispatchTopic(tenant),
      key: "warm",
      value: JSON.stringify({ workflow_ref: "echo", input: {}, dispatch_key: "warm" }),
    }]);
    while ((await count(tenant)) < 1) await delay(100);
    const total = 5000;
    const sent = new Map<string, number>();
    const t0 = performance.now();
    const sends: Promise<unknown>[] = [];
    for (let i = 0; i < total; i += 10) {
      const wait = t0 + i - performance.now();
      if (wait > 0) await delay(wait);
      const at = Date.now();
      const batch = Array.from({ length: 10 }, (_, j) => `l-${i + j}`);
      for (const k of batch) sent.set(k, at);
      sends.push(producer.send(batch.map((k) => ({
        topic: dispatchTopic(tenant),
        key: k,
        value: JSON.stringify({ workflow_ref: "echo", input: {}, dispatch_key: k }),
      }))));
    }
    await Promise.all(sends);
    while ((await count(tenant)) < total + 1) await delay(200);
    const rows = await sql<{ k: string; at: number }[]>`
      select dispatch_key as k, extract(epoch from created_at)::float8 * 1000 as at
        from runs where tenant_id = ${tenant} and dispatch_key like 'l-%'`;
    const lat = rows.map((r) => r.at - sent.get(r.k)!).sort((a, b) => a - b);
    const q = (p: number) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))];
    return { variant: v.name, round, p50: q(0.5), p99: q(0.99), rss: peakRssMb(relay.child.pid) };
  } finally {
    await relay.stop();
  }
}

try {
  const deadline = Date.now() + 60 * SECOND;
  while (
    !(await fetch(`http://127.0.0.1:${port}/readyz`).then((r) => {
      void r.body?.cancel();
      return r.ok;
    }, () => false))
  ) {
    if (Date.now() > deadline) throw new Error("api not ready");
    await delay(100);
  }
  log(
    `load ${loadAvg()}; ${N} messages, ${ROUNDS} round(s), variants ${variants.map((v) => v.name)}`,
  );
  const results = [];
  const direct = new Map<number, number>();
  for (let r = 1; r <= ROUNDS; r++) {
    const order = r % 2 === 1 ? variants : [...variants].reverse();
    if (args.http) {
      direct.set(r, await httpRound(r));
      log(`direct HTTP r${r}: ${direct.get(r)!.toFixed(0)}/s (wrk, 64 connections, new keys)`);
    }
    for (const v of order) {
      const res = await drainRound(r, v);
      results.push(res);
      log(
        `drain ${v.name} r${r}: ${res.rate.toFixed(0)}/s (created_at span), ${
          res.wallRate.toFixed(0)
        }/s wall, ${res.cores.toFixed(2)} cores (${
          (res.cores / res.wallRate * 1e6).toFixed(0)
        } µs per message), peak RSS ${
          res.rss.toFixed(0)
        } MB, pauses ${res.pauses}, subscribes ${res.subs} (${res.logFile})`,
      );
    }
    if (args.live) {
      for (const v of order) {
        const res = await liveRound(r, v);
        log(
          `live ${v.name} r${r}: publish→run p50 ${res.p50.toFixed(0)} ms, p99 ${
            res.p99.toFixed(0)
          } ms, peak RSS ${res.rss.toFixed(0)} MB`,
        );
      }
    }
  }
  for (const [r, rate] of direct) {
    for (const res of results.filter((x) => x.round === r)) {
      log(`round ${r}: ${res.variant} ÷ direct HTTP = ${(res.rate / rate).toFixed(2)}`);
    }
  }
  if (variants.length === 2) {
    for (let r = 1; r <= ROUNDS; r++) {
      const a = results.find((x) => x.round === r && x.variant === "this")!;
      const b = results.find((x) => x.round === r && x.variant === "other")!;
      log(
        `round ${r}: this ÷ other = ${(a.rate / b.rate).toFixed(2)} (wall ${
          (a.wallRate / b.wallRate).toFixed(2)
        })`,
      );
    }
  }
  log(`load ${loadAvg()}`);
} finally {
  await producer.close().catch(() => {});
  await kadmin.close().catch(() => {});
  await outbox?.stop();
  await api.stop();
  await sql.end();
  await admin.unsafe(`drop database if exists ${dbName} with (force)`);
  await admin.end();
}
