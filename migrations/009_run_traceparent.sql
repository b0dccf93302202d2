-- The W3C trace a run belongs to: the `traceparent` of the request that
-- admitted it (for a dispatch message, the relay's request carries the
-- message's), or of the API's own span when tracing is on. The worker runs
-- each attempt in a span of that trace, and the outbox sends it as the
-- `traceparent` header of the run's events. Nullable without a default:
-- adding it rewrites nothing.
alter table runs add column traceparent text;
