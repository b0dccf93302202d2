/**
 * The lane repair's statement (worker/lane_repairer.ts): walk the lanes of
 * the runs that are queued, a few at a time, and lower any lane that is
 * missing or later than its earliest queued run.
 *
 * The claim reads who has due work from `queue_lanes` alone (db/claims.ts),
 * so a queued run whose lane was never lowered is never claimed. Every
 * statement that queues a run lowers its lane in the same statement
 * (db/queue_sql.ts `laneMoves`); this is the check behind that rule, for
 * what the rule cannot cover: runs an API older than migration 016 admitted
 * while a rolling deploy had both running, a bug, an operator's hand edit.
 *
 * It only ever lowers a lane (`least`), so it cannot hide a due run; a lane
 * it lowers on a stale snapshot (a claim took those runs meanwhile) looks
 * due, and the next claim that serves it pushes it back: one claim's probes.
 */
import type { Sql } from "./pool.ts";

/** A lane's key: the primary key of `queue_lanes`. */
export interface LaneKey {
  tenant_id: string;
  workflow_name: string;
  workflow_version: number;
}

/** One round of `repairLanes`. */
export interface LaneRepairRound {
  /** The last lane walked; undefined when the walk reached the end. */
  last: LaneKey | undefined;
  /** The lanes walked, at most `limit`. */
  walked: number;
  /** The lanes that were missing or later than their earliest queued run, now lowered. */
  repaired: (LaneKey & { ready_at: Date })[];
}

/**
 * Walks up to `limit` lanes of queued unlimited runs after `after` (from the
 * first when undefined), in key order: a loose scan of
 * runs_queued_workflow_idx's three leading columns, one probe per lane
 * however many runs each has. Each lane's earliest queued run is one probe
 * per priority (-10..10), and a lane that is missing or later than it is
 * lowered to it. Limited versions are left out: their due time is the
 * concurrency group's (`concurrency_slots.due_at`).
 */
export async function repairLanes(
  sql: Sql,
  after: LaneKey | undefined,
  limit: number,
): Promise<LaneRepairRound> {
  // '' sorts first: a fresh walk starts before every tenant, and version 0
  // is before every version.
  const a = after ?? { tenant_id: "", workflow_name: "", workflow_version: 0 };
  const rows = await sql<
    (LaneKey & { limited: boolean; first_at: Date | null; repaired: boolean })[]
  >`
    with recursive walk (tenant_id, workflow_name, workflow_version, concurrency_key) as (
      (select r.tenant_id collate "C", r.workflow_name, r.workflow_version, r.concurrency_key
         from runs r
        where r.status = 'queued'
          and (r.tenant_id collate "C", r.workflow_name, r.workflow_version)
              > (${a.tenant_id}::text collate "C", ${a.workflow_name}::text,
                 ${a.workflow_version}::int)
        order by r.tenant_id collate "C", r.workflow_name, r.workflow_version
        limit 1)
      union all
      select n.*
        from walk w
       cross join lateral (
             select r.tenant_id collate "C", r.workflow_name, r.workflow_version,
                    r.concurrency_key
               from runs r
              where r.status = 'queued'
                and (r.tenant_id collate "C", r.workflow_name, r.workflow_version)
                    > (w.tenant_id, w.workflow_name, w.workflow_version)
              order by r.tenant_id collate "C", r.workflow_name, r.workflow_version
              limit 1) n
    ),
    walked as materialized (
      select * from walk limit ${limit}
    ),
    -- Each unlimited lane's earliest queued run: one probe per priority.
    -- The tenant back in the default collation, queue_lanes' (its key's).
    firsts as (
      select w.tenant_id collate "default" as tenant_id, w.workflow_name, w.workflow_version,
             (select min(x.run_after) from generate_series(10, -10, -1) p(priority)
               cross join lateral (
                     select r.run_after from runs r
                      where r.tenant_id collate "C" = w.tenant_id and r.status = 'queued'
                        and r.workflow_name = w.workflow_name
                        and r.workflow_version = w.workflow_version
                        and r.priority = p.priority
                      order by r.run_after
                      limit 1) x) as first_at
        from walked w
       where w.concurrency_key is null
    ),
    lowered as (
      insert into queue_lanes (tenant_id, workflow_name, workflow_version, ready_at)
      select f.tenant_id, f.workflow_name, f.workflow_version, f.first_at
        from firsts f
       where f.first_at is not null
       order by 1, 2, 3
      -- Only a lane missing or later than its earliest run is written: the
      -- condition is the conflict's, so the lane is found by its key (a
      -- lane that is fine is locked for the statement, never rewritten).
      on conflict (tenant_id, workflow_name, workflow_version) do update
         set ready_at = excluded.ready_at
       where queue_lanes.ready_at > excluded.ready_at
      returning tenant_id, workflow_name, workflow_version
    )
    select w.tenant_id, w.workflow_name, w.workflow_version,
           w.concurrency_key is not null as limited, f.first_at,
           exists (select 1 from lowered l
                    where l.tenant_id = w.tenant_id collate "C" and l.workflow_name = w.workflow_name
                      and l.workflow_version = w.workflow_version) as repaired
      from walked w
      left join firsts f
        on f.tenant_id = w.tenant_id collate "C" and f.workflow_name = w.workflow_name
       and f.workflow_version = w.workflow_version
     order by w.tenant_id collate "C", w.workflow_name, w.workflow_version`;
  const last = rows.at(-1);
  return {
    last: rows.length < limit || !last ? undefined : {
      tenant_id: last.tenant_id,
      workflow_name: last.workflow_name,
      workflow_version: last.workflow_version,
    },
    walked: rows.length,
    repaired: rows.filter((r) => r.repaired).map((r) => ({
      tenant_id: r.tenant_id,
      workflow_name: r.workflow_name,
      workflow_version: r.workflow_version,
      ready_at: r.first_at!,
    })),
  };
}
