-- Cancelling a run (POST /v1/runs/{id}/cancel). A queued run is cancelled at
-- once; a running one only has its cancel requested here: its worker sees
-- the request in its next heartbeat (or sooner, by NOTIFY poimen_cancel),
-- aborts the handler and writes `cancelled`, fenced by attempt like every
-- other transition. Once requested, a run never goes back to the queue: a
-- failed attempt, a released one (worker shutdown) or an expired lease ends
-- it `cancelled` instead. Nullable without a default: adding it rewrites
-- nothing. Numbered 006: 003 and 005 are taken by the plan-stability work.
alter table runs add column cancel_requested_at timestamptz;
