-- The workflow catalog: what admission needs to know of each workflow
-- version, registered by the workers that host it, so the API validates a
-- run's input without loading any team's code.
--
-- A version is immutable once registered: a worker whose definition of an
-- existing name@version differs refuses to start. The catalog is global,
-- like the code it describes (workflows are deployed by operators, not by
-- tenants); a run records which version it was pinned to.
create table workflow_versions (
  name          text not null check (name ~ '^[a-z][a-z0-9_.-]{0,99}$'),
  version       integer not null check (version >= 1),
  -- The input as JSON Schema (draft 2020-12), from the definition's zod schema.
  input_schema  jsonb not null,
  -- null: the API's DEFAULT_MAX_ATTEMPTS.
  max_attempts  integer check (max_attempts between 1 and 1000),
  registered_by text not null,
  registered_at timestamptz not null default now(),
  primary key (name, version)
);

-- Live workers and the versions each hosts ('name@version'). A worker
-- renews its row while it runs and deletes it when it stops; a row whose
-- expiry has passed is a worker that died. A queued run of a version no live
-- worker hosts is waiting for one (GET /v1/runs/{id}, metrics, console).
create table workflow_workers (
  worker_id  text primary key,
  workflows  text[] not null,
  started_at timestamptz not null default now(),
  expires_at timestamptz not null
);

-- Claiming only what a worker hosts: a tenant's due queued runs of one
-- version, oldest first, is one range of this index, so runs of versions
-- this worker does not host are never read (a backlog of them costs
-- nothing). The tenants with queued runs are still a loose scan of its
-- leading column. Replaces runs_queued_tenant_idx (tenant_id, run_after,
-- run_id); collation "C" as migration 003 explains.
create index runs_queued_workflow_idx
  on runs (tenant_id collate "C", workflow_name, workflow_version, run_after, run_id)
  where status = 'queued';
drop index runs_queued_tenant_idx;
