-- Debounce (issue 32): a version may declare `debounce: { key?, period,
-- maxWait }` (milliseconds; `key` a JSON Pointer into the input, as
-- concurrency keys). A request for a key whose debounced run is still
-- pending (queued, never claimed) joins that run: its input is replaced and
-- its start moved to now + period, never past maxWait after the run's
-- creation (the burst's first request). Stored with the version, immutable
-- like the rest of it: { "key": "/customer_id", "period": 30000,
-- "maxWait": 300000 } (key absent: one burst per tenant and version).
alter table workflow_versions
  add column if not exists debounce jsonb
    constraint workflow_versions_debounce_shape check (
      debounce is null or (
        jsonb_typeof(debounce -> 'period') = 'number'
        and jsonb_typeof(debounce -> 'maxWait') = 'number'
        and (debounce -> 'key' is null or jsonb_typeof(debounce -> 'key') = 'string')));

-- The run's debounce group: the text of the input's value at the version's
-- debounce key ('' without a key), set at admission; null: not debounced.
-- No default: adding the column rewrites nothing.
alter table runs add column if not exists debounce_key text;

-- The dispatch keys of the requests that joined a pending debounced run
-- (the run holds only its first request's key, runs_dispatch_key_uq): a
-- request sent again with such a key is a replay of the run it joined, as a
-- request whose key a run holds is, even once that run has started. Read
-- and written only by debounced admissions (db/debounce.ts), by primary
-- key; deleted with their run by retention (debounce_joins_run_idx). A row
-- per joining request that carried a key: as many as the runs' events at
-- most, and gone with them.
create table if not exists debounce_joins (
  tenant_id    text not null,
  dispatch_key text not null,
  run_id       uuid not null,
  primary key (tenant_id, dispatch_key)
);
create index if not exists debounce_joins_run_idx on debounce_joins (tenant_id, run_id);
