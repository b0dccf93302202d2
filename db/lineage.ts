/**
 * Run lineage (migration 024): what a worker needs of a parent to admit its
 * children (`ctx.start`, worker/child_runs.ts). The children themselves are
 * inserted by the admission statement (db/admission.ts) and listed by
 * `selectRuns` (db/runs.ts), by parent or by root.
 */
import type { Sql } from "./pool.ts";

/**
 * The root of run `runId`'s tree: its `root_run_id`, or the run itself when
 * it is a root; undefined when the tenant has no such run. One probe of the
 * primary key.
 */
export async function selectRootRunId(
  sql: Sql,
  tenantId: string,
  runId: string,
): Promise<string | undefined> {
  const [row] = await sql<{ root_run_id: string }[]>`
    select coalesce(root_run_id, run_id) as root_run_id from runs
     where tenant_id = ${tenantId} and run_id = ${runId}`;
  return row?.root_run_id;
}
