-- Schedules declared in a workflow's definition (`schedules`, issue 32,
-- workflows/define.ts). A worker registering a version writes the schedules
-- that the workflow's newest registered version declares, for each tenant
-- each one names, and removes those an older version declared that the
-- newest no longer does (worker/presence.ts, db/schedules.ts).
--
-- workflow_versions.schedules: the declarations, as registered (id, cron,
-- timezone, input, overlap, catchup, tenants); null: none, which is what
-- every version registered before this migration says. Part of the
-- version's immutable definition, like its signals: a worker registering the
-- version with other schedules refuses to start (workflow-conflict).
--
-- schedules.declared_by: the workflow whose definition declares the
-- schedule, and declared_version the version that wrote it; both null for a
-- schedule created at run time (`/v1/schedules`, `deno task schedule`), which
-- registration never touches.
--
-- schedules_declared_idx: a worker's start finds its workflows' declared
-- schedules (to remove those no longer declared) without reading every
-- tenant's schedules.
--
-- Nullable columns without a default rewrite nothing; both tables hold a row
-- per deployed version or per schedule, not per run, so the index is built in
-- place (the schedules table is not among the large ones).
alter table workflow_versions add column schedules jsonb;
alter table schedules add column declared_by text, add column declared_version int;
create index schedules_declared_idx on schedules (declared_by) where declared_by is not null;
