/**
 * The competitors, run in process under Node 22 (bench/queues.mjs, next to
 * its dependencies in bench/.deps): pg-boss `send` with singletonKey and
 * graphile-worker `addJob` with jobKey, new and duplicate keys, N concurrent
 * callers; and one graphile-worker runner executing no-op jobs.
 */
import type { Sql } from "../db/pool.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { NODE, QUEUES_SCRIPT } from "./tools.ts";
import { type BenchContext, check, log, REPLAY_KEYS } from "./run_context.ts";

/** One round of pg-boss's or graphile-worker's enqueue at `conns` concurrent callers. */
export async function queueEnqueue(
  ctx: BenchContext,
  url: string,
  sql: Sql,
  lib: "pg-boss" | "graphile",
  mode: "new" | "dup",
  conns: number,
  round: number,
) {
  const prefix = `${lib}-${mode}-${conns}-${round}-${ctx.stamp}`;
  const child = new Deno.Command(NODE, {
    args: [
      QUEUES_SCRIPT,
      "enqueue",
      lib,
      mode,
      String(conns),
      String(ctx.cfg.secs),
      prefix,
      String(REPLAY_KEYS),
    ],
    cwd: `${PROJECT_ROOT}bench/.deps`,
    env: { DATABASE_URL: url, BENCH_WARMUP_MS: String(ctx.cfg.warm * 1000) },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const name = lib === "pg-boss" ? "pg-boss send (node)" : "graphile-worker addJob (node)";
  const rss = setInterval(() => ctx.stats(name).sampleRss(child.pid), 200);
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
  ctx.figures.push({
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

/**
 * One round of graphile-worker's runner (concurrency 16) executing as many
 * no-op jobs as the poimen worker ran.
 */
export async function graphileWorkRound(ctx: BenchContext, url: string, round: number) {
  const prefix = `gwork-${round}-${ctx.stamp}`;
  const child = new Deno.Command(NODE, {
    args: [
      QUEUES_SCRIPT,
      "work",
      "graphile",
      "16",
      String(ctx.cfg.workerJobs),
      prefix,
    ],
    cwd: `${PROJECT_ROOT}bench/.deps`,
    env: { DATABASE_URL: url },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const gstats = ctx.stats("graphile-worker runner (node)");
  const rss = setInterval(() => gstats.sampleRss(child.pid), 200);
  const out = await child.output();
  clearInterval(rss);
  const dec = new TextDecoder();
  if (out.code !== 0) throw new Error(`graphile work failed:\n${dec.decode(out.stderr)}`);
  const r = JSON.parse(dec.decode(out.stdout).trim().split("\n").pop()!);
  check(
    r.executed === ctx.cfg.workerJobs,
    `graphile round ${round}: ${r.executed} executions for ${ctx.cfg.workerJobs} jobs`,
  );
  ctx.figures.push({
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
