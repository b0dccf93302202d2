-- Child results and fan-in (issue 31): a parent run waits for its children
-- (`result()` of one, `ctx.map` of many) as it waits for a sleep or a
-- signal: `waiting`, holding no lease and no slot, with wait_reason
-- 'children' and wait_name the awaited group (the call name of one child,
-- or of a map whose children are `<name>#c<i>`). It is woken by the
-- statement that makes its last awaited child final (db/fan_in.ts): that
-- statement counts the child off `children_awaited` (the awaited children
-- still unfinished, counted under the parent's row lock when it suspended)
-- and, at zero, or at a failure when `wait_fail_fast`, queues the parent.
-- The child's outcome itself is its own row (status, result, error), kept
-- while its root lives (retention), and read by the parent on resume. A
-- parent woken so keeps wait_name (what it waited for, which its run.woken
-- names) until its next wait; wait_reason is cleared, as every wake does.
--
-- Nullable columns without a default rewrite nothing. The constraint is
-- replaced NOT VALID (new rows are held to it at once) and validated in 029
-- without stopping writes.
alter table runs
  add column children_awaited integer,
  add column wait_fail_fast boolean;
alter table runs
  drop constraint runs_waiting_for,
  add constraint runs_waiting_for
    check ((status <> 'waiting' or wait_reason is not null)
           and (wait_reason is null
                or (status in ('waiting', 'cancelled') and wait_name is not null
                    and wait_reason in ('sleep', 'signal', 'children'))))
    not valid;
