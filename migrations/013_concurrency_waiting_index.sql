-- The concurrency groups that hold runs back: at their limit, with runs
-- queued. What the console's queue page lists per tenant, most queued first
-- (db/concurrency_overview.ts): a range of this index, so the page costs the
-- groups it shows, not every group the tenant has (a key's row stays in
-- concurrency_slots until retention purges it idle). The claim never reads
-- it: it walks groups with room (concurrency_slots_due_idx since migration
-- 016). Updates of a slot row are not HOT already (that index's predicate
-- reads the counts), so this adds one index entry per update of a full group
-- with a backlog, none for other groups. Collation "C" as migration 003
-- explains.
create index concurrency_slots_waiting_idx
  on concurrency_slots (tenant_id collate "C", queued desc, workflow_name, concurrency_key)
  where queued > 0 and running >= max_running;
