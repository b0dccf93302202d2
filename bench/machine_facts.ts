/**
 * The facts a report states about where it was measured: the CPU model and
 * the versions of everything measured or measuring (Deno, Postgres with its
 * durability settings, wrk, pgbench, Node and the queues).
 */
import type { Sql } from "../db/pool.ts";
import { depVersion, sh } from "./tools.ts";

/** The CPU's model name from /proc/cpuinfo. */
export async function cpuModel(): Promise<string> {
  return (await sh("cat", ["/proc/cpuinfo"], { allowFail: true })).stdout
    .match(/model name\s*:\s*(.*)/)?.[1] ?? "unknown CPU";
}

/** Every version the report names, in its order. */
export async function versions(
  admin: Sql,
  tools: { wrk: string; pgbench: string; nodeVersion: string },
): Promise<Record<string, string>> {
  const [pg] = await admin<{ v: string; fsync: string; sc: string }[]>`
    select version() as v, current_setting('fsync') as fsync,
           current_setting('synchronous_commit') as sc`;
  return {
    Deno: Deno.version.deno,
    PostgreSQL: `${String(pg.v).split(" on ")[0]} (fsync=${pg.fsync}, synchronous_commit=${pg.sc})`,
    wrk: (await sh(tools.wrk, ["-v"], { allowFail: true })).stdout.split("\n")[0].trim(),
    pgbench: (await sh(tools.pgbench, ["--version"])).stdout.trim(),
    Node: tools.nodeVersion,
    "pg-boss": await depVersion("pg-boss"),
    "graphile-worker": await depVersion("graphile-worker"),
  };
}
