-- Autovacuum settings per hot table (docs/operations.md, "Vacuum").
--
-- Postgres' defaults wait for 20 % of a table to be dead before vacuuming it
-- (and 10 % changed before analyzing it): on `runs` with 30 days of finished
-- runs, that is millions of dead tuples and their index entries, read past by
-- every claim before one vacuum starts, and the default cost limit (200) then
-- paces that vacuum for hours. The tables below are few and known: each gets
-- a trigger proportionate to its size and a vacuum that is allowed to finish.
--
-- ALTER TABLE … SET (storage parameters) takes a SHARE UPDATE EXCLUSIVE lock:
-- reads and writes go on beside it (only another vacuum or DDL waits), and it
-- rewrites nothing; the migrator's lock_timeout bounds any wait for it.
-- Numbered 017: 016 is the due-work claim's.

-- runs: one row per run, updated at every state change (non-HOT: the status
-- and the lease are indexed), kept 30 days under eight indexes.
alter table runs set (
  -- 2 % dead (plus 1,000 rows) rather than 20 %: at 10M rows, 200k dead
  -- tuples rather than 2M before a vacuum, so the queue's partial indexes
  -- stay near the size of what they index.
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_threshold = 1000,
  -- Inserts alone start a vacuum at 5 % new rows: it sets the visibility map,
  -- so index-only scans of finished runs do not visit the heap.
  autovacuum_vacuum_insert_scale_factor = 0.05,
  -- Fresh statistics at 2 % changed: the run mix (queued, running, finished)
  -- moves far faster than 10 % of 30 days of runs.
  autovacuum_analyze_scale_factor = 0.02,
  -- Ten times the default budget per round (200), 1 ms pauses: a vacuum of a
  -- large table finishes in minutes, not hours, while churn goes on.
  autovacuum_vacuum_cost_limit = 2000,
  autovacuum_vacuum_cost_delay = 1
);

-- work_events: the outbox; every row inserted once, marked published once
-- (non-HOT: the pending index's predicate reads it), deleted after
-- OUTBOX_RETENTION_MS. The pending index is the outbox's claim: its dead
-- entries are what a claim reads past.
alter table work_events set (
  -- As runs: a vacuum per 2 % of dead rows keeps the pending index small.
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_threshold = 1000,
  -- Append-mostly: an insert-driven vacuum every 5 % keeps the visibility
  -- map current (and freezes young rows before a wraparound vacuum must).
  autovacuum_vacuum_insert_scale_factor = 0.05,
  autovacuum_analyze_scale_factor = 0.02,
  -- As runs: a vacuum that finishes while the churn goes on.
  autovacuum_vacuum_cost_limit = 2000,
  autovacuum_vacuum_cost_delay = 1
);

-- concurrency_slots: one small row per concurrency group, rewritten by every
-- admission, claim and end of a limited run (non-HOT: the ready and waiting
-- indexes' predicates read the counts). A few thousand rows can gather
-- hundreds of thousands of dead versions in minutes.
alter table concurrency_slots set (
  -- A fixed trigger, not a share: vacuum after 500 dead versions whatever
  -- the row count (a share of a small table is too few to matter, of a
  -- large one too many).
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 500,
  autovacuum_analyze_scale_factor = 0,
  autovacuum_analyze_threshold = 500,
  -- A small table: no pause, so each vacuum is over in a moment.
  autovacuum_vacuum_cost_delay = 0
);

-- workflow_workers: one row per live worker, renewed every few seconds by
-- each (its liveness): small and rewritten all the time, as concurrency_slots.
alter table workflow_workers set (
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 200,
  autovacuum_analyze_scale_factor = 0,
  autovacuum_analyze_threshold = 200,
  autovacuum_vacuum_cost_delay = 0
);
