/**
 * pgbench on the minimal endpoint's INSERT, as a prepared statement, at the
 * same connections as the HTTP scenarios: what the statement costs without
 * HTTP.
 */
import type { Sql } from "../db/pool.ts";
import { delay, SECOND } from "../core/time.ts";
import { sh } from "./tools.ts";
import { type BenchContext, check, log, q } from "./run_context.ts";
import { countWhere } from "./scenario_support.ts";

/** One round at `conns` clients; skipped with a note when the server has too few free connections. */
export async function pgbench(
  ctx: BenchContext,
  url: string,
  sql: Sql,
  conns: number,
  round: number,
  tmp: string,
) {
  const prefix = `pgbench-${conns}-${round}-${ctx.stamp}`;
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
      ctx.pgbench,
      [...base, "-T", String(ctx.cfg.warm), "-D", `prefix=${prefix}w`, db],
      { allowFail: true },
    );
    if (warm.code === 0) break;
    if (!warm.stderr.includes("too many clients")) throw new Error(warm.stderr);
    if (attempt === 6) {
      ctx.notes.push(
        `pgbench @${conns} round ${round}: skipped, the server had too few free connections ` +
          `(max_connections, shared with other sessions).`,
      );
      return;
    }
    await delay(5 * SECOND);
  }
  const logPrefix = `${tmp}/pgb-${conns}-${round}`;
  const before = (await countWhere(sql, "bench_minimal", prefix)).n;
  const out = await sh(ctx.pgbench, [
    ...base,
    "-T",
    String(ctx.cfg.secs),
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
  ctx.figures.push({
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
