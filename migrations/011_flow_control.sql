-- Flow control: priorities, and concurrency limits per workflow and key.
--
-- Priority: -10..10, higher first within a tenant (tenants still take turns:
-- a tenant's priorities order its own runs, never another tenant's). A
-- replay of a dispatch key returns the first run, so it keeps the first
-- priority. A constant default adds the column without rewriting the table.
alter table runs
  add column priority smallint not null default 0
    constraint runs_priority_range check (priority between -10 and 10),
  -- The run's concurrency group when its version declares a limit: the text
  -- of the input's value at the version's key pointer ('' without a key:
  -- one group per tenant and workflow). null: not limited.
  add column concurrency_key text;

-- A version may declare `concurrency: { limit, key? }`: at most `limit` of
-- the workflow's runs running at once per tenant, or per value of the JSON
-- Pointer `key` into the input, evaluated at admission.
alter table workflow_versions
  add column concurrency_limit integer check (concurrency_limit between 1 and 100000),
  add column concurrency_key text check (concurrency_key ~ '^(/([^~/]|~[01])*)+$'),
  add constraint workflow_versions_key_needs_limit
    check (concurrency_key is null or concurrency_limit is not null);

-- The queue in priority order: a tenant's due queued runs of one version,
-- highest priority first, then oldest, is one range of this index (the
-- claim's head probes and picks walk it in order; not-due runs of a higher
-- priority than the due ones are read past). Same name and leading columns
-- as migration 008's, so the tenants' loose scan and everything else that
-- named it keep working.
create index runs_queued_workflow_prio_idx
  on runs (tenant_id collate "C", workflow_name, workflow_version, priority desc, run_after, run_id)
  where status = 'queued';
drop index runs_queued_workflow_idx;
alter index runs_queued_workflow_prio_idx rename to runs_queued_workflow_idx;

-- A limited workflow's queued runs per concurrency group, in the order a
-- group starts them: priority, then age.
create index runs_queued_key_idx
  on runs (tenant_id collate "C", workflow_name, concurrency_key, priority desc, run_after, run_id)
  where status = 'queued' and concurrency_key is not null;

-- One row per concurrency group (tenant, workflow, key) that ever had a run:
-- how many of its runs are running and queued, kept by the statements that
-- move its runs (admission: queued + 1; claim: queued - n, running + n;
-- every end of an attempt: running - 1, and queued + 1 when the run goes
-- back to the queue; cancelling a queued run: queued - 1), each in the
-- statement that changes the run, so the counts commit with the runs.
-- Counting the runs at claim time instead cannot hold a limit: under READ
-- COMMITTED two claims each count the other's new runs as queued. A claim
-- takes a group by locking its row (FOR UPDATE SKIP LOCKED), so two workers
-- never start runs of one group at once, and increments apply to the
-- latest row whatever the statement's snapshot.
create table concurrency_slots (
  tenant_id       text not null,
  workflow_name   text not null,
  concurrency_key text not null,
  -- The limit, as the newest admitted run's version declared it.
  max_running     integer not null,
  running         integer not null default 0,
  queued          integer not null default 0,
  -- When a claim last looked at the group: groups with room take turns.
  served_at       timestamptz not null default '-infinity',
  primary key (tenant_id, workflow_name, concurrency_key)
);

-- The groups with queued runs and room to start one: what the claim of a
-- limited workflow walks, per tenant, least recently served first. A full
-- group (or one with nothing queued) is not in it, so its backlog costs the
-- claim nothing. Collation "C" as migration 003 explains.
create index concurrency_slots_ready_idx
  on concurrency_slots (tenant_id collate "C", workflow_name, served_at)
  where queued > 0 and running < max_running;

-- Runs in flight per tenant, and expired leases per tenant: the claim's fair
-- share counts a tenant's running runs, and the reclaimer finds each tenant's
-- expired leases, each one range of this index naming its tenant (with
-- `runs` hash partitioned by tenant, one partition). The tenants with running
-- runs are a loose scan of its leading column. Replaces
-- runs_running_lease_idx (lease_expires_at, tenant_id, run_id), which served
-- "expired leases across all tenants"; same predicate, for the same reason
-- (migration 003).
create index runs_running_tenant_idx
  on runs (tenant_id collate "C", lease_expires_at, run_id)
  where status = 'running' and lease_expires_at is not null;
drop index runs_running_lease_idx;
