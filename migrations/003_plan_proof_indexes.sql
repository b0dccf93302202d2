-- Indexes the hot statements can rely on whatever the statistics say.
--
-- Our tables are often never analyzed (a new database, after a restore, and
-- always where autovacuum is off). The planner then guesses every
-- selectivity, and at some table sizes two indexes cost the same to within
-- its fuzz; a prepared statement keeps the generic plan it got there as the
-- table grows. Admission fell from ~2,200/s to ~80/s at 60,000 runs that way:
-- its replay probe kept runs_status_idx and filtered the tenant's runs one by
-- one. So each hot lookup is written so that only its intended index can
-- serve it.
--
-- The device: the hot indexes key tenant_id in collation "C" and the hot
-- statements compare tenant_id in collation "C". An index matches a clause
-- only when their collations are the same, so the primary key and the other
-- tenant-led indexes (default collation) cannot serve those clauses at all.
-- Tenant ids are ASCII ([a-z0-9_-]), and every deterministic collation calls
-- two strings equal only when their bytes are, so uniqueness and equality
-- are unchanged; "C" also compares by memcmp, cheaper than the locale's rules.

-- Admission's replay probe: (tenant_id collate "C", dispatch_key) equality.
-- ON CONFLICT (tenant_id, dispatch_key) WHERE dispatch_key IS NOT NULL
-- infers this index (inference ignores collation unless the statement names one).
create unique index runs_dispatch_key_c_uq on runs (tenant_id collate "C", dispatch_key)
  where dispatch_key is not null;
drop index runs_dispatch_key_uq;
alter index runs_dispatch_key_c_uq rename to runs_dispatch_key_uq;

-- Claiming, fairly across tenants: the tenants with queued runs (a loose
-- index scan, one probe per tenant) and each tenant's oldest due runs. Replaces
-- runs_queued_idx (run_after, tenant_id, run_id), which served "oldest first
-- across all tenants".
create index runs_queued_tenant_idx on runs (tenant_id collate "C", run_after, run_id)
  where status = 'queued';
drop index runs_queued_idx;

-- Reclaiming expired leases. Its predicate was status = 'running', which the
-- finishing statements (complete, fail, heartbeat, release: by primary key,
-- fenced on status = 'running') imply too: on a small table the planner
-- scanned this whole index for them instead of probing the primary key. No
-- finishing statement mentions the lease's expiry, so with it in the
-- predicate they cannot use this index; the reclaimer's
-- lease_expires_at < now() implies it. A lease exists exactly while the run
-- is running (the check says so), so the index still holds every running run.
-- (lease_expires_at is not null alone would not do: without statistics the
-- planner takes IS NOT NULL to hold for 99.5 % of rows and never uses it.)
alter table runs add constraint runs_lease_while_running
  check ((status = 'running') = (lease_expires_at is not null));
drop index runs_running_lease_idx;
create index runs_running_lease_idx on runs (lease_expires_at, tenant_id, run_id)
  where status = 'running' and lease_expires_at is not null;

-- runs_status_idx (tenant_id, status, run_id) took an entry for every run and
-- every status change, and competed with the primary key and the unique key
-- for every tenant-led lookup. Listing a tenant's runs newest first walks the
-- primary key backwards (succeeded runs, the bulk, and queued and running
-- ones, the newest, are met early); the statuses that are rare and asked for
-- keep an index.
drop index runs_status_idx;
create index runs_failed_idx on runs (tenant_id, status, run_id)
  where status in ('failed', 'cancelled');
