-- poimen:no-transaction
-- A parent's children and a root's tree (migration 024), by tenant: the
-- children listing of GET /v1/runs/{id} (one range per page, in run id
-- order), GET /v1/runs?root_run_id= and the cancel cascade. Partial: the
-- runs a caller admitted (most of them) are in neither. Collation "C" as
-- migration 003 explains. Built concurrently; every statement may run again.
create index concurrently if not exists runs_parent_idx
  on runs (tenant_id collate "C", parent_run_id, run_id)
  where parent_run_id is not null;
create index concurrently if not exists runs_root_idx
  on runs (tenant_id collate "C", root_run_id, run_id)
  where root_run_id is not null;
