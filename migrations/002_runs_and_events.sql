-- Runs: the queue and the source of truth. tenant_id leads every key and
-- index so the table can later be hash partitioned or distributed by tenant
-- without changing a constraint.
create table runs (
  tenant_id        text not null references tenants (tenant_id),
  run_id           uuid not null,
  workflow_ref     text not null,          -- as the caller asked
  workflow_name    text not null,
  workflow_version integer not null,       -- pinned at admission
  input            jsonb not null,
  goal_id          text,
  dispatch_key     text,
  source           text not null,          -- 'http:<token name>' or 'kafka:<topic>/<partition>/<offset>'
  status           text not null default 'queued'
                   check (status in ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
  attempts         integer not null default 0,
  max_attempts     integer not null,
  run_after        timestamptz not null default now(),
  lease_owner      text,
  lease_expires_at timestamptz,
  result           jsonb,
  error            jsonb,
  event_seq        integer not null default 1, -- seq of the last event written for this run
  created_at       timestamptz not null default now(),
  updated_at       timestamptz not null default now(),
  started_at       timestamptz,
  finished_at      timestamptz,
  primary key (tenant_id, run_id)
);

-- Admission idempotency: the same (tenant, dispatch_key) makes one run.
-- Admission is INSERT ... ON CONFLICT (tenant_id, dispatch_key)
-- WHERE dispatch_key IS NOT NULL DO NOTHING; this index is what catches the race.
create unique index runs_dispatch_key_uq on runs (tenant_id, dispatch_key)
  where dispatch_key is not null;

-- Claiming: the oldest due queued runs, across tenants.
create index runs_queued_idx on runs (run_after, tenant_id, run_id) where status = 'queued';
-- Reclaiming expired leases.
create index runs_running_lease_idx on runs (lease_expires_at, tenant_id, run_id)
  where status = 'running';
-- Listing a tenant's runs newest first (run ids are UUIDv7, time ordered).
create index runs_goal_idx on runs (tenant_id, goal_id, run_id) where goal_id is not null;
create index runs_status_idx on runs (tenant_id, status, run_id);

-- The transactional outbox: every state change of a run appends one row in
-- the same transaction as the change. (run_id, seq) is the fold key
-- consumers dedupe by.
create table work_events (
  tenant_id    text not null,
  run_id       uuid not null,
  seq          integer not null,
  event_id     bigint generated always as identity,
  type         text not null,
  goal_id      text,
  dispatch_key text,
  payload      jsonb not null default '{}',
  at           timestamptz not null default now(),
  published_at timestamptz,
  primary key (tenant_id, run_id, seq)
);
create unique index work_events_event_id_uq on work_events (event_id, tenant_id);
create index work_events_pending_idx on work_events (event_id, tenant_id) where published_at is null;
create index work_events_published_idx on work_events (published_at, tenant_id)
  where published_at is not null;
