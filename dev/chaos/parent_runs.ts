/**
 * What the checks read of the parent workflow's runs (dev/chaos/plan.ts'
 * PARENT): each parent with its children as Postgres holds them, and how
 * often it waited. The checks are dev/chaos/verdict_children.ts.
 */
import type { Sql } from "../../db/pool.ts";

/** One child of a parent: its key, status and the `j` its input names. */
export interface ChildSeen {
  dispatchKey: string | null;
  status: string;
  j: number | null;
}

/** A run of the parent workflow, with its children. */
export interface ParentRun {
  tenant: string;
  runId: string;
  dispatchKey: string | null;
  status: string;
  result: unknown;
  children: ChildSeen[];
  /** Its `run.waiting` events: each a wait for its children that suspended it. */
  waited: number;
}

/** Every run of `workflow` with its children (read once, after the drain). */
export async function selectParentRuns(sql: Sql, workflow: string): Promise<ParentRun[]> {
  const rows = await sql<
    {
      tenant_id: string;
      run_id: string;
      dispatch_key: string | null;
      status: string;
      result: unknown;
      children: ChildSeen[] | null;
      waited: number;
    }[]
  >`
    select r.tenant_id, r.run_id, r.dispatch_key, r.status, r.result,
           (select jsonb_agg(jsonb_build_object(
                     'dispatchKey', c.dispatch_key, 'status', c.status,
                     'j', case when jsonb_typeof(c.input -> 'j') = 'number'
                               then (c.input ->> 'j')::int end))
              from runs c
             where c.tenant_id = r.tenant_id and c.parent_run_id = r.run_id) as children,
           (select count(*) from work_events e
             where e.tenant_id = r.tenant_id and e.run_id = r.run_id
               and e.type = 'run.waiting')::int as waited
      from runs r
     where r.workflow_name = ${workflow}`;
  return rows.map((r) => ({
    tenant: r.tenant_id,
    runId: r.run_id,
    dispatchKey: r.dispatch_key,
    status: r.status,
    result: r.result,
    children: r.children ?? [],
    waited: r.waited,
  }));
}
