-- Durable workflows, part 1 (issue 30): steps whose results survive the
-- worker, sleeps and signal waits that free it, and a mailbox of signals.
-- Numbered 021: 018-020 are other changes'. The indexes on runs and the
-- validation of the constraints added here NOT VALID are in 022 (no
-- transaction: built and checked without stopping writes).

-- A run that waits (a long sleep, a signal) is `waiting`: no lease, no
-- concurrency slot, no attempt spent, not due until woken (by its signal, or
-- by its deadline in run_after, 'infinity' for none). The new set of
-- statuses replaces the old check; NOT VALID here (new rows are held to it at
-- once), validated in 022.
alter table runs
  drop constraint runs_status_check,
  add constraint runs_status_known
    check (status in ('queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled'))
    not valid;

-- What a waiting run waits for: `sleep` (wait_name: the sleep's name) or
-- `signal` (wait_name: the signal's name). Set by the statement that
-- suspends the run, cleared by the one that wakes it; a run cancelled while
-- waiting keeps them (what it was waiting for), which is also how the
-- cancel tells it from a queued run (db/cancellation.ts).
alter table runs
  add column wait_reason text,
  add column wait_name text;
alter table runs
  add constraint runs_waiting_for
    check ((status <> 'waiting' or wait_reason is not null)
           and (wait_reason is null
                or (status in ('waiting', 'cancelled') and wait_name is not null
                    and wait_reason in ('sleep', 'signal'))))
    not valid;

-- A run's durable calls (ctx.step, ctx.sleep, ctx.waitForSignal), one row
-- each, by name: `name`, `name#2`, … in call order (`seq`). Written only by
-- the attempt holding the run's lease, each write fenced as a completion is
-- (db/run_steps.ts). A completed step's result is what every later attempt
-- gets instead of calling it again. Deleted with the run by retention
-- (db/retention.ts), like its events.
create table run_steps (
  tenant_id    text not null,
  run_id       uuid not null,
  name         text not null,
  seq          integer not null check (seq >= 1),
  kind         text not null check (kind in ('step', 'sleep', 'signal')),
  -- waiting: a sleep or a wait under way (until: its deadline); completed:
  -- its result is stored; failed: its last try threw (error), the attempt failed.
  status       text not null check (status in ('waiting', 'completed', 'failed')),
  result       jsonb,
  -- The result's size as JSON (bytes): what step.completed reports.
  size         integer,
  error        jsonb,
  -- A sleep's end, a wait's timeout (null: none); computed once, by Postgres' clock.
  until        timestamptz,
  -- A wait's signal name.
  signal_name  text,
  -- The attempt that wrote the row last.
  attempt      integer not null,
  started_at   timestamptz not null default now(),
  updated_at   timestamptz not null default now(),
  completed_at timestamptz,
  primary key (tenant_id, run_id, name)
);

-- A run's mailbox: signals sent to it (POST /v1/runs/{id}/signals), kept
-- until a wait consumes one (consumed_as: the wait's step name), then with
-- the run until retention purges it. A (name, signal_id) is stored once:
-- sending it again is a replay, never a second signal.
create table run_signals (
  tenant_id   text not null,
  run_id      uuid not null,
  name        text not null,
  signal_id   text not null,
  -- Arrival order: a wait takes the first unconsumed signal of its name.
  n           bigint generated always as identity,
  payload     jsonb not null,
  received_at timestamptz not null default now(),
  consumed_as text,
  consumed_at timestamptz,
  primary key (tenant_id, run_id, name, signal_id)
);

-- The unconsumed signals of one name of one run, first first: what a wait
-- takes and what a suspend checks for. Collation "C" as migration 003
-- explains: no other index can serve the statements' tenant clause.
-- poimen:lock-ok: the table is new and empty: nothing waits for the build
create index run_signals_unconsumed_idx
  on run_signals (tenant_id collate "C", run_id, name, n)
  where consumed_as is null;
