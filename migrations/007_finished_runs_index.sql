-- Retention: the outbox process purges finished runs (succeeded, failed,
-- cancelled) older than RUN_RETENTION_MS, oldest first, in small batches.
-- This index is what it reads: only finished runs, in finish order, so a
-- batch is one short range scan however large the table, and the live queue
-- (queued, running) never enters it. tenant_id and run_id after the time, as
-- in every index here (the table may later be partitioned by tenant).
create index runs_finished_idx on runs (finished_at, tenant_id, run_id)
  where status in ('succeeded', 'failed', 'cancelled');
