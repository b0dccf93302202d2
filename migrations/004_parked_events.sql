-- Parked events: an event the broker refuses for a permanent reason (too
-- large, invalid record) or that is over EVENTS_MAX_MESSAGE_BYTES is set
-- aside instead of being retried forever, which would stall every batch
-- behind it. A parked row stays unpublished (published_at is null), so the
-- outbox's purge of published events never takes it; retention of finished
-- runs deletes it with its run. An operator un-parks it once the cause is
-- fixed (e.g. the topic's max.message.bytes raised) by clearing parked_at and
-- parked_reason together: the check below holds the two to each other.
-- Numbered 004: 003 is taken by the plan-stability indexes.
alter table work_events add column parked_at timestamptz;
alter table work_events add column parked_reason text;
alter table work_events add constraint work_events_parked_reason
  check ((parked_at is null) = (parked_reason is null));

-- What the outbox claims: unpublished and not parked. Same name, so the
-- statements and the plan test keep referring to it.
drop index work_events_pending_idx;
create index work_events_pending_idx on work_events (event_id, tenant_id)
  where published_at is null and parked_at is null;
-- The parked gauge counts these.
create index work_events_parked_idx on work_events (parked_at, tenant_id)
  where parked_at is not null;
