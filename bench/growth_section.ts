/**
 * The growth section: poimen's admission of new keys at 16 connections with
 * 0, 100,000 and 1,000,000 finished runs already in the table, which is never
 * analyzed (autovacuum off on it), a database per size.
 */
import type { Sql } from "../db/pool.ts";
import { freePort, PoimenProcess } from "../dev/processes.ts";
import { type BenchContext, check, log } from "./run_context.ts";
import { createDb, tenantToken, waitHttp } from "./scenario_support.ts";
import { type HttpTarget, measureHttp } from "./http_admission.ts";

/** Every round of the growth section. */
export async function growthSection(ctx: BenchContext, admin: Sql) {
  const dbs: { size: number; url: string; sql: Sql; token: string }[] = [];
  for (const size of ctx.cfg.sizes) {
    const { url, sql } = await createDb(ctx, admin, `poimen_bench_${ctx.stamp}_g${size}`);
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
    for (let round = 1; round <= ctx.cfg.rounds; round++) {
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
          await measureHttp(ctx, db.sql, t, 16, round);
          ctx.figures[ctx.figures.length - 1].group = "growth";
        } finally {
          ctx.stats("api").sampleRss(api.pid);
          await api.stop();
        }
      }
    }
  } finally {
    for (const db of dbs) await db.sql.end();
  }
}
