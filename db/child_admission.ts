/**
 * The admission statement of child runs (`ctx.start`, worker/child_runs.ts):
 * `insertRuns` and, in the same transaction, each new child's
 * `child.started` on its parent, whose row lock settles the race with a
 * cancel of the parent (db/cascade.ts): a non-detached child admitted under
 * a parent found cancelled (or cancel-requested, or final) is cancelled
 * before the transaction commits, so no child escapes its parent's cancel.
 */
import type { Sql } from "./pool.ts";
import { inTransaction } from "./pool.ts";
import { type AdmittedRow, insertRuns, type NewRun } from "./admission.ts";
import { noteChildrenStarted } from "./child_events.ts";
import { cancelRuns } from "./cascade.ts";

/**
 * `insertRuns` for a batch of child runs (each with `parent_run_id`), with
 * their parents' `child.started` and the cancel of those whose parent is
 * closed, in one transaction. Returns what `insertRuns` returned: a child
 * cancelled here is returned as admitted (its parent's step gets its id;
 * the parent is being cancelled itself).
 */
export async function insertChildRuns(sql: Sql, runs: NewRun[]): Promise<AdmittedRow[]> {
  return await inTransaction(sql, async (tx) => {
    const rows = await insertRuns(tx, runs);
    const byTenant = new Map<string, AdmittedRow[]>();
    for (const r of rows) {
      if (!r.created || !r.parent_run_id) continue;
      byTenant.set(r.tenant_id, [...byTenant.get(r.tenant_id) ?? [], r]);
    }
    for (const [tenant, created] of byTenant) {
      const closed = new Set(
        await noteChildrenStarted(
          tx,
          tenant,
          created.map((r) => ({
            run_id: r.run_id,
            parent_run_id: r.parent_run_id!,
            detached: r.detached,
          })),
        ),
      );
      const orphans = created.filter((r) => closed.has(r.parent_run_id!) && !r.detached);
      await cancelRuns(tx, tenant, { runIds: orphans.map((r) => r.run_id) });
    }
    return rows;
  });
}
