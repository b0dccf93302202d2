-- The parked gauge counted `parked_at is not null` over
-- work_events_parked_idx. Without statistics the planner takes IS NOT NULL to
-- hold for 99.5 % of rows, so it read the whole table instead. A parked event
-- is never published (published_at is null), and IS NULL is taken to hold
-- for 0.5 %: with both in the predicate and in the count, the index is used
-- whatever the statistics say.
drop index work_events_parked_idx;
create index work_events_parked_idx on work_events (parked_at, tenant_id)
  where published_at is null and parked_at is not null;
