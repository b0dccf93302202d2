-- poimen:no-transaction
-- Who has due work, as one index range (issue 28): the claims cost the runs
-- they claim, not the tenants, versions and groups that wait beside them.
-- No transaction: an index on concurrency_slots (a row per key ever used) is
-- built concurrently, and the backfill reads every queued run once. Every
-- statement here may run again after a failure.

-- A lane per (tenant, workflow version) of unlimited runs: `ready_at` is never
-- later than the earliest run_after of the lane's queued runs (a lower bound:
-- a lane may look due and hold nothing due, never the reverse). Every
-- statement that makes an unlimited run queued (admission, a retry, a
-- release, a reclaim) lowers it in the same statement (db/queue_sql.ts
-- laneMoves); a claim that served the lane pushes it back: to now() (the back
-- of the line) while due runs remain, to its next run's run_after when none
-- does, 'infinity' when nothing is queued (db/claims.ts claimRuns). Statements
-- that take runs out of the queue (claims, cancels) need not touch it. A row
-- per tenant and version that ever had a run: small, and never read unless due.
create table if not exists queue_lanes (
  tenant_id        text not null,
  workflow_name    text not null,
  workflow_version integer not null,
  ready_at         timestamptz not null,
  primary key (tenant_id, workflow_name, workflow_version)
);

-- The due lanes of one hosted version, least recently served first: one range.
-- Cross-tenant by design (tests/db_tenant_scope_test.ts says why).
create index concurrently if not exists queue_lanes_ready_idx
  on queue_lanes (workflow_name, workflow_version, ready_at);

-- A concurrency group's due time, the same lower bound for its queued runs:
-- lowered with its counts by every statement that queues one of its runs,
-- pushed back by the claim that served it. '-infinity' for the groups that
-- exist now: due, so the first claims that look at them set the real time
-- (no scan of runs for them here).
alter table concurrency_slots add column if not exists due_at timestamptz not null
  default '-infinity';

-- The groups with room and queued runs, per workflow, in due order: what the
-- limited claim walks (one range per hosted workflow). A group whose runs are
-- due tomorrow is past the range's end; a full one is not in it.
create index concurrently if not exists concurrency_slots_due_idx
  on concurrency_slots (workflow_name, due_at)
  where queued > 0 and running < max_running;

-- Replaced by concurrency_slots_due_idx (it served the per-tenant walk over
-- groups with room, due or not).
drop index concurrently if exists concurrency_slots_ready_idx;

-- The lanes of the runs queued now (one read of the queue; may run again).
insert into queue_lanes (tenant_id, workflow_name, workflow_version, ready_at)
select tenant_id, workflow_name, workflow_version, min(run_after)
  from runs
 where status = 'queued' and concurrency_key is null
 group by 1, 2, 3
on conflict (tenant_id, workflow_name, workflow_version) do update
   set ready_at = least(queue_lanes.ready_at, excluded.ready_at);
