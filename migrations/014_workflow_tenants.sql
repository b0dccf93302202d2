-- Workflows for some tenants only: a version may name the tenants that may
-- start it, as the canonical text of a tenant scope (contracts/tenant_scope.ts:
-- tenant ids and prefixes, sorted, comma-separated, e.g. 'acme,team-*').
-- null: every tenant (what every version registered before this migration
-- says). Part of the version's immutable definition, like its input and its
-- concurrency limit: a worker registering the version with other tenants
-- refuses to start; widening or narrowing a workflow's tenants is a new
-- version. The API refuses any other tenant's run of the version as an
-- unknown workflow and never names the version to them.
alter table workflow_versions
  add column tenants text
    constraint workflow_versions_tenants_text
    check (tenants ~ '^[a-z0-9_-]*\*?(,[a-z0-9_-]*\*?)*$' and tenants <> '*');
