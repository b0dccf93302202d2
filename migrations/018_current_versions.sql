-- An explicit current version per workflow name: what a run asking for the
-- bare name (`billing.invoice`, no `@version`) is pinned to. Before this
-- migration the bare name meant "the newest registered version", so the first
-- worker of a new version to start (a canary, a mistake) moved every such
-- caller to it at once, and stopping it did not move them back.
--
-- Now the first version of a name to be registered becomes its current
-- version by itself (in the statement that registers it, db/catalog.ts); any
-- later version only when an operator promotes it (`deno task workflow
-- promote name@version`), and a promotion may as well go back to an older
-- version. A tenant that may not start the current version (a version's
-- `tenants`, migration 014) gets the newest older version it may start: the
-- current version is a ceiling, never a version it cannot start.
create table workflow_current (
  name        text primary key,
  version     integer not null,
  -- When and by whom it was made current: 'registration by <worker id>', an
  -- operator's promotion ('promote'), or this migration.
  promoted_at timestamptz not null default now(),
  promoted_by text not null,
  foreign key (name, version) references workflow_versions (name, version)
);

-- Existing databases keep what bare names meant the moment before: each
-- name's newest registered version is its current one, so no caller moves
-- when this applies (a tenant allowed only older versions keeps the newest of
-- those, as before). From here on, a newly registered version waits for a
-- promotion.
insert into workflow_current (name, version, promoted_by)
select name, max(version), 'migration 018'
  from workflow_versions
 group by name;
