-- poimen:no-transaction
-- Waiting runs (migration 021), by tenant and deadline: the leader's waker
-- finds the tenants with waiting runs (a loose scan of the leading column)
-- and each one's runs whose deadline passed (one range each), and a
-- tenant's quota counts its waiting runs as queued work (one capped range).
-- A wait without a deadline ('infinity') is past every range's end. What
-- they wait for is included, so the gauge of waiting runs by reason reads
-- the index alone. Built concurrently; every statement here may run again.
create index concurrently if not exists runs_waiting_tenant_idx
  on runs (tenant_id collate "C", run_after, run_id) include (wait_reason)
  where status = 'waiting';

-- The constraints 021 added NOT VALID, checked without stopping writes.
alter table runs validate constraint runs_status_known;
alter table runs validate constraint runs_waiting_for;
