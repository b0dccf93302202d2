/**
 * The HTTP section: wrk's load (bench/wrk/admit.lua) at 16 and 64
 * connections on the minimal endpoint (bench/minimal_server.ts) and on
 * poimen's POST /v1/runs with new keys, replays and no key, rounds
 * alternating A B A B; in each round then pgbench on the same INSERT and the
 * queues' enqueue with keys. Every scenario's rows are counted against the
 * requests answered.
 */
import type { Sql } from "../db/pool.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { freePort, PoimenProcess } from "../dev/processes.ts";
import { delay } from "../core/time.ts";
import { sh } from "./tools.ts";
import { type BenchContext, check, CONNS, log, LUA, REPLAY_KEYS } from "./run_context.ts";
import { countWhere, createDb, settled, tenantToken, waitHttp } from "./scenario_support.ts";
import { pgbench } from "./pgbench_insert.ts";
import { queueEnqueue } from "./queue_competitors.ts";

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

async function wrk(
  ctx: BenchContext,
  url: string,
  conns: number,
  secs: number,
  env: Record<string, string>,
) {
  const out = await sh(ctx.wrk, [
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
async function sampleWaits<T>(
  ctx: BenchContext,
  sql: Sql,
  label: string,
  app: string,
  fn: () => Promise<T>,
) {
  const hist = ctx.waits.get(label) ?? new Map<string, number>();
  ctx.waits.set(label, hist);
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

/** One process under wrk's load, and how to count what it wrote. */
export interface HttpTarget {
  scenario: string;
  url: string;
  pid: number;
  proc: string;
  token: string;
  mode: "new" | "replay" | "nokey";
  table: "runs" | "bench_minimal";
}

/**
 * Warms `t` up, then measures it at `conns` connections for a round; its
 * figure (and its process's CPU) is added to the context.
 */
export async function measureHttp(
  ctx: BenchContext,
  sql: Sql,
  t: HttpTarget,
  conns: number,
  round: number,
) {
  const prefix = `${t.scenario.replace(/\W+/g, "")}-${conns}-${round}-${ctx.stamp}`;
  const env = {
    BENCH_TOKEN: t.token,
    BENCH_MODE: t.mode,
    BENCH_PREFIX: t.mode === "replay" ? `replay-${ctx.stamp}` : prefix,
    BENCH_KEYS: String(REPLAY_KEYS),
  };
  await wrk(ctx, t.url, conns, ctx.cfg.warm, { ...env, BENCH_PREFIX: `${env.BENCH_PREFIX}w` });
  if (t.mode === "replay") {
    // The key set must exist before replays are measured.
    for (let k = 0; k < REPLAY_KEYS; k++) {
      const res = await fetch(t.url, {
        method: "POST",
        headers: { authorization: `Bearer ${t.token}`, "content-type": "application/json" },
        body: JSON.stringify({
          workflow_ref: "echo",
          input: { n: 1 },
          dispatch_key: `replay-${ctx.stamp}-${k}`,
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
  const { value: w, cores } = await ctx.stats(t.proc).during(
    t.pid,
    () =>
      t.table === "runs"
        ? sampleWaits(
          ctx,
          sql,
          `${t.scenario}, ${conns} conns`,
          "poimen-api",
          () => wrk(ctx, t.url, conns, ctx.cfg.secs, env),
        )
        : wrk(ctx, t.url, conns, ctx.cfg.secs, env),
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
  ctx.figures.push({
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

/** The HTTP section: every round of HTTP, pgbench and enqueue scenarios, on a database of its own. */
export async function httpSection(ctx: BenchContext, admin: Sql) {
  const { url, sql } = await createDb(ctx, admin, `poimen_bench_${ctx.stamp}`);
  const token = await tenantToken(sql, "bench");
  const tmp = await Deno.makeTempDir({ prefix: "poimen-bench-" });
  try {
    for (let round = 1; round <= ctx.cfg.rounds; round++) {
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
          for (const t of targets) await measureHttp(ctx, sql, t, conns, round);
        }
      } finally {
        ctx.stats("api").sampleRss(api.pid);
        ctx.stats("minimal endpoint").sampleRss(minimal.pid);
        await api.stop();
        try {
          minimal.kill("SIGTERM");
        } catch { /* gone */ }
        await minimal.status;
      }
      for (const conns of CONNS) await pgbench(ctx, url, sql, conns, round, tmp);
      for (const conns of CONNS) {
        for (const lib of ["pg-boss", "graphile"] as const) {
          for (const mode of ["new", "dup"] as const) {
            await queueEnqueue(ctx, url, sql, lib, mode, conns, round);
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
