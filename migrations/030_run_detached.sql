-- Detached child runs (issue 31): `ctx.start(name, wf, input, { detached:
-- true })` starts a child that a cancel of its parent (or of any ancestor)
-- does not cascade to: it lives its own life, though it keeps its lineage
-- (parent_run_id, root_run_id) for the console and retention. Set once, at
-- admission (db/admission.ts); false for every run a caller admitted.
--
-- A constant default is stored in the catalog, not in each row: adding the
-- column rewrites nothing and locks the table only for the catalog change.
alter table runs add column detached boolean not null default false;
