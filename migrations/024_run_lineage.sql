-- Child runs (issue 31): a run started by another run's handler
-- (`ctx.start`) records its parent and the root of its tree. Both are null
-- for a run a caller admitted; a child of a root has root_run_id = its
-- parent. Set once, at admission (db/admission.ts), never changed: the
-- child's dispatch key `child:<parent run_id>:<name>` is what makes a
-- retried parent find the child it started. The indexes that find a
-- parent's children and a root's tree are built concurrently in 025.
--
-- Adding nullable columns without a default rewrites nothing.
alter table runs
  add column parent_run_id uuid,
  add column root_run_id uuid;
