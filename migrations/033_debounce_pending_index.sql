-- poimen:no-transaction
-- At most one pending debounced run per (tenant, workflow version, debounce
-- key): the arbiter of the debounced admission's INSERT … ON CONFLICT DO
-- UPDATE (db/debounce.ts), so concurrent requests of one burst make one run
-- whatever their timing. Pending is queued and never claimed: a claim sets
-- started_at for good, so a run that started (even one released or retried
-- back to the queue) leaves the index and the next request starts a new
-- burst. Partial: the runs of workflows without debounce are not in it, and
-- their admissions never touch it. Collation "C" as migration 003 explains.
-- Built concurrently; the statement may run again.
create unique index concurrently if not exists runs_debounce_pending_uq
  on runs (tenant_id collate "C", workflow_name, workflow_version, debounce_key)
  where debounce_key is not null and status = 'queued' and started_at is null;
