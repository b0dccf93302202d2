-- Schedules (issue 32): recurring runs of a workflow on a 5-field cron in
-- an IANA time zone, per tenant, managed at run time (`/v1/schedules`,
-- `deno task schedule`). An occurrence is a run admitted through the one
-- admission door with the dispatch key `schedule:<schedule_id>:<UTC instant>`,
-- so any number of tickers start each occurrence exactly once; this table
-- only says what to tick and where each schedule's ticking has got to.
--
-- next_at: the earliest occurrence not yet ticked (the ticker's cursor);
-- null while paused. last_run_id: the run of the last admitted occurrence,
-- read by the `skip` overlap policy (one primary-key probe of runs, by
-- tenant). ticking_until: a ticker's claim on the schedule while it ticks it
-- (a lease, so no transaction stays open while it admits; a ticker that
-- dies leaves it to expire). The primary key leads with the tenant: every read and write of
-- one schedule is one probe; the tickers' scan of due schedules across
-- tenants is schedules_due_idx, a range of a partial index in due order.
create table schedules (
  tenant_id text not null,
  schedule_id text not null collate "C",
  workflow_ref text not null,
  cron text not null,
  timezone text not null default 'UTC',
  input jsonb not null default 'null'::jsonb,
  overlap text not null default 'allow' check (overlap in ('skip', 'allow')),
  catchup text not null default 'skip' check (catchup in ('skip', 'latest', 'all')),
  paused boolean not null default false,
  next_at timestamptz,
  last_run_id uuid,
  ticking_until timestamptz,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  primary key (tenant_id, schedule_id)
);

create index schedules_due_idx on schedules (next_at) where next_at is not null;
