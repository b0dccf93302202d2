/**
 * Claiming: a worker takes due queued runs, fairly across tenants, under a
 * lease (see db/queue_sql.ts for the queue as a whole).
 */
import type { Sql } from "./pool.ts";
import { EVENT_COLUMNS, updateThroughKey } from "./queue_sql.ts";
import { startedPayload } from "./event_payloads.ts";

// The claimed row's lease_owner is the claiming worker.
const STARTED = startedPayload({ attempt: "attempts", worker: "lease_owner" });

/** A run a worker just claimed: what it needs to execute it. */
export interface ClaimedRun {
  tenant_id: string;
  run_id: string;
  workflow_ref: string;
  workflow_name: string;
  workflow_version: number;
  input: unknown;
  goal_id: string | null;
  dispatch_key: string | null;
  /** This attempt's number, 1 on the first. */
  attempts: number;
  max_attempts: number;
  lease_expires_at: Date;
  /** The run's W3C trace (core/tracing.ts): the attempt is a span in it. */
  traceparent?: string | null;
  /** Its concurrency group's key when its version is limited; null: not limited. */
  concurrency_key?: string | null;
  /** The run that started it (`ctx.start`); null: a caller's run. */
  parent_run_id?: string | null;
}

/**
 * The workflow versions a worker hosts, as two parallel arrays (one
 * `unnest` in the claim): it claims runs pinned to these and no others.
 */
export interface HostedVersions {
  names: string[];
  versions: number[];
}

/**
 * The CTE `claimed`: the rows of a CTE `picked` (whole `runs` rows, locked
 * by the statement) made `running` under the lease of `$4` (the owner) for
 * `$5` ms, their attempt counted. Through `updateThroughKey`
 * (db/queue_sql.ts): each row is found by a probe of the primary key
 * whatever the plan.
 */
const CLAIMED_FROM_PICKED = `claimed as (
  ${updateThroughKey("runs", "tenant_id, run_id", "select * from picked")}
     set status = 'running',
         attempts = runs.attempts + 1,
         lease_owner = $4::text,
         lease_expires_at = now() + $5::float8 * interval '1 millisecond',
         started_at = coalesce(runs.started_at, now()),
         updated_at = now(),
         event_seq = runs.event_seq + 1
   where runs.status = 'queued'
  returning runs.tenant_id, runs.run_id, runs.workflow_ref, runs.workflow_name,
            runs.workflow_version, runs.input, runs.goal_id, runs.dispatch_key,
            runs.attempts, runs.max_attempts, runs.lease_expires_at, runs.event_seq,
            runs.traceparent, runs.concurrency_key, runs.lease_owner, runs.parent_run_id
)`;

/** Each claimed run's `run.started` event `{attempt, worker}`, then the claimed runs. */
const STARTED_EVENTS_OF_CLAIMED = `ev as (
  insert into work_events (${EVENT_COLUMNS})
  select tenant_id, run_id, event_seq, 'run.started', goal_id, dispatch_key,
         ${STARTED}, now()
    from claimed
)
select tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input, goal_id,
       dispatch_key, attempts, max_attempts, lease_expires_at, traceparent, concurrency_key,
       parent_run_id
  from claimed`;

/**
 * Runs a claim statement (`$1` hosted names, `$2` their versions, `$3` the
 * limit, `$4` the owner, `$5` the lease in ms) unnamed, never prepared:
 * Postgres plans the unnamed statement with the values bound each time (a
 * custom plan), where a prepared one may switch to its generic plan after
 * five calls. The generic plan of a claim reads what the custom one reads,
 * but without the limit and the hosted versions its estimate is 10 to 2,000
 * times higher (the priority walk's recursion is guessed at hundreds of rows
 * a lane), which is what the planner compares against, and what JIT
 * compiles for (db/pool.ts). The cost: a Parse and a Describe per call, one
 * more round trip than a prepared statement's.
 */
async function claimUnprepared(
  sql: Sql,
  text: string,
  owner: string,
  limit: number,
  leaseMs: number,
  hosted: HostedVersions,
): Promise<ClaimedRun[]> {
  return await sql.unsafe<ClaimedRun[]>(
    text,
    [hosted.names, hosted.versions, limit, owner, leaseMs],
    { prepare: false },
  );
}

// The locked lanes' rows, by their key (db/queue_sql.ts updateThroughKey).
const LANES_PUSHED = updateThroughKey(
  "queue_lanes",
  "tenant_id, workflow_name, workflow_version",
  "select * from lane_locks order by 1, 2, 3",
);
const GROUPS_SERVED = updateThroughKey(
  "concurrency_slots (tenant_id, workflow_name, concurrency_key, max_running)",
  "tenant_id, workflow_name, concurrency_key",
  "select tenant_id, workflow_name, concurrency_key, 1 from group_next order by 1, 2, 3",
);

/**
 * A recursive CTE `name (…keys, priority)`: for each row of `from` (whose
 * columns `keys` name a lane or group), the priorities its queued runs have,
 * highest first, then a last row whose priority is null. A loose scan of an
 * index in `priority desc` order: one probe per priority held, plus one, so
 * a lane or group pays for the priorities it uses (most use one), not for
 * the 21 a run may have (migration 011). `match` is the condition on `r`
 * (a runs row) for the row `x` of the CTE; its `priority` is `x.priority`.
 * The caller's WITH must be `with recursive`.
 */
function priorityWalk(name: string, from: string, keys: string, match: string): string {
  const cols = keys.split(",").map((k) => k.trim());
  const of = (alias: string) => cols.map((c) => `${alias}.${c}`).join(", ");
  const probe = (alias: string, below: string) =>
    `(select r.priority from runs r
       where ${match.replaceAll("x.", `${alias}.`)}${below}
       order by r.priority desc limit 1)`;
  return `${name} (${keys}, priority) as (
    select ${of("s")}, ${probe("s", "")} from ${from} s
    union all
    select ${of("w")}, ${probe("w", " and r.priority < w.priority")}
      from ${name} w where w.priority is not null
  )`;
}

// A lane's queued runs (x: a row with its tenant_id, workflow_name and
// workflow_version): one range of runs_queued_workflow_idx.
const LANE_RUNS = `r.tenant_id collate "C" = x.tenant_id and r.status = 'queued'
       and r.workflow_name = x.workflow_name and r.workflow_version = x.workflow_version`;

// A group's queued runs (x: a row with its tenant_id, workflow_name and
// concurrency_key): one range of runs_queued_key_idx.
const GROUP_RUNS = `r.tenant_id collate "C" = x.tenant_id and r.workflow_name = x.workflow_name
       and r.concurrency_key = x.concurrency_key and r.status = 'queued'
       and r.concurrency_key is not null`;

const LANE_PRIORITIES = priorityWalk(
  "lane_priorities",
  "shares",
  "tenant_id, workflow_name, workflow_version",
  LANE_RUNS,
);

const GROUP_PRIORITIES = priorityWalk(
  "group_priorities",
  "groups",
  "tenant_id, workflow_name, concurrency_key",
  GROUP_RUNS,
);

// The statement of `claimRuns` (its parameters: `claimUnprepared`).
const CLAIM_RUNS = `
    with recursive versions (name, version) as (
      select * from unnest($1::text[], $2::int[])
    ),
    -- The due lanes, least recently served first: per hosted version one
    -- range of queue_lanes_ready_idx, then the first of those. Not locked:
    -- claims of several workers share a lane's runs (each skips the rows
    -- the others hold).
    lanes as materialized (
      select l.*
        from versions v
       cross join lateral (
             select q.tenant_id, q.workflow_name, q.workflow_version, q.ready_at,
                    q.ctid as seen
               from queue_lanes q
              where q.workflow_name = v.name and q.workflow_version = v.version
                and q.ready_at <= now()
              order by q.ready_at
              limit $3::int) l
       order by l.ready_at, l.tenant_id
       limit $3::int
    ),
    -- The slots, round-robin over those lanes.
    shares as (
      select tenant_id, workflow_name, workflow_version, seen, count(*)::int as share
        from (select l.* from lanes l
               cross join generate_series(1, $3::int) k
               order by k, l.ready_at, l.tenant_id
               limit $3::int) slot
       group by 1, 2, 3, 4
    ),
    -- The priorities each lane holds queued runs at (priorityWalk).
    ${LANE_PRIORITIES},
    -- Each lane's share of due runs, highest priority then oldest: one range
    -- of runs_queued_workflow_idx per priority it holds. A row locked here
    -- but not among the share is unlocked when the statement commits.
    picked as (
      select c.*
        from shares s
       cross join lateral (
             select o.* from lane_priorities p
              cross join lateral (
                    select r.* from runs r
                     where r.tenant_id collate "C" = s.tenant_id and r.status = 'queued'
                       and r.workflow_name = s.workflow_name
                       and r.workflow_version = s.workflow_version
                       and r.priority = p.priority and r.run_after <= now()
                     order by r.run_after
                     limit s.share
                     for update skip locked) o
              where p.tenant_id = s.tenant_id and p.workflow_name = s.workflow_name
                and p.workflow_version = s.workflow_version
              order by o.priority desc, o.run_after
              limit s.share) c
    ),
    ${CLAIMED_FROM_PICKED},
    -- Each lane's new place in line: its next queued run's run_after, now()
    -- (the back of the line) if that is due, 'infinity' when none is queued.
    -- Looked up even when the lane gave its whole share: a lane assumed to
    -- have more would be left looking due with nothing in it, and every
    -- claim after would visit it once before any lane served after it.
    lane_next as (
      select s.seen,
             greatest(now(), coalesce((
                         select min(x.run_after) from lane_priorities p
                          cross join lateral (
                                select r.run_after from runs r
                                 where r.tenant_id collate "C" = s.tenant_id
                                   and r.status = 'queued'
                                   and r.workflow_name = s.workflow_name
                                   and r.workflow_version = s.workflow_version
                                   and r.priority = p.priority
                                   and not exists (select 1 from claimed c
                                                    where c.tenant_id = r.tenant_id
                                                      and c.run_id = r.run_id)
                                 order by r.run_after
                                 limit 1) x
                          where p.tenant_id = s.tenant_id and p.workflow_name = s.workflow_name
                            and p.workflow_version = s.workflow_version), 'infinity')) as ready_at
        from shares s
    ),
    -- Only the lanes still as this statement's snapshot saw them, and not
    -- held by another statement: see the function's comment.
    lane_locks as (
      select q.tenant_id, q.workflow_name, q.workflow_version, n.ready_at
        from lane_next n
       cross join lateral (
             select q.tenant_id, q.workflow_name, q.workflow_version
               from queue_lanes q where q.ctid = n.seen
                for update skip locked) q
    ),
    lanes_pushed as (
      ${LANES_PUSHED}
         set ready_at = excluded.ready_at
    ),
    ${STARTED_EVENTS_OF_CLAIMED}`;

/**
 * Claims up to `limit` due queued runs of the `hosted` versions (none with a
 * concurrency limit: see `claimLimitedRuns`) for `owner`, fairly across
 * tenants: each becomes `running` with a lease of `leaseMs`, its attempt
 * counted, and a `run.started` event `{attempt, worker}` appended.
 *
 * Who has due work is read from the lanes (migration 016), a row per tenant
 * and version whose `ready_at` is never later than its earliest queued run:
 * per hosted version one range of `queue_lanes_ready_idx`, `ready_at <=
 * now()` in that order, the first `limit` of them. The lanes least recently
 * served come first (a served lane goes to the back of the line): fair by a
 * rotating cursor, not by counting anyone's runs. The `limit` slots go round
 * the lanes in that order (one alone gets them all), and each lane gives its
 * share highest priority first, then oldest (a tenant's priorities order its
 * own runs only), skipping rows other claims hold (`FOR UPDATE SKIP LOCKED`);
 * a lane with fewer due runs than its share leaves those slots empty until
 * the next claim. Runs of versions this worker does not host are never read.
 *
 * Then each served lane is pushed back, in the same statement: to now()
 * when it still has a due run, to its next run's run_after when it has none
 * due, 'infinity' when nothing is queued. Only a
 * lane whose row is the version this statement's snapshot saw is pushed back
 * (locked by its ctid, `SKIP LOCKED`): a newer version means a statement
 * queued a run in it after the snapshot, a run this statement could not see,
 * so the lane is left as it is, due. A statement that queues a run later
 * waits for this lock and lowers the lane again (db/queue_sql.ts
 * `laneMoves`). So no due run is left behind a lane pushed to tomorrow.
 *
 * The cost: one probe per hosted version, one row per lane served, three
 * probes per priority each lane served holds, plus one (which priorities it
 * holds: priorityWalk; its share; its next run), and one per claimed run;
 * tenants, lanes and runs that are not due are never read. Sent unprepared,
 * so always planned for its limit and hosted versions (`claimUnprepared`).
 */
export async function claimRuns(
  sql: Sql,
  owner: string,
  limit: number,
  leaseMs: number,
  hosted: HostedVersions,
): Promise<ClaimedRun[]> {
  return await claimUnprepared(sql, CLAIM_RUNS, owner, limit, leaseMs, hosted);
}

// The statement of `claimLimitedRuns` (its parameters: `claimUnprepared`).
const CLAIM_LIMITED_RUNS = `
    with recursive versions (name, version) as (
      select * from unnest($1::text[], $2::int[])
    ),
    names as (select distinct name from versions),
    -- The due groups with room, least recently served first, each held for
    -- the rest of the statement: the room is the locked (newest) row's.
    groups as materialized (
      select g.*
        from names n
       cross join lateral (
             select s.tenant_id, s.workflow_name, s.concurrency_key, s.due_at,
                    s.max_running - s.running as room, s.ctid as at
               from concurrency_slots s
              where s.workflow_name = n.name and s.queued > 0 and s.running < s.max_running
                and s.due_at <= now()
              order by s.due_at
              limit $3::int
                for update skip locked) g
       order by g.due_at, g.tenant_id, g.concurrency_key
       limit $3::int
    ),
    -- Each group's next runs (at most its room), highest priority then
    -- oldest, of the versions this worker hosts; then one per group in turn.
    candidates as (
      select l.r, g.due_at, g.tenant_id, g.concurrency_key,
             row_number() over (partition by g.tenant_id, g.workflow_name, g.concurrency_key
                                order by (l.r).priority desc, (l.r).run_after) as nth
        from groups g
       cross join lateral (
             select r from runs r
              where r.tenant_id collate "C" = g.tenant_id and r.workflow_name = g.workflow_name
                and r.concurrency_key = g.concurrency_key and r.status = 'queued'
                and r.concurrency_key is not null and r.run_after <= now()
                and exists (select 1 from versions v
                             where v.name = r.workflow_name and v.version = r.workflow_version)
              order by r.priority desc, r.run_after
              limit g.room
                for update skip locked) l
    ),
    picked as (
      select (c.r).*
        from (select * from candidates order by nth, due_at, tenant_id, concurrency_key
               limit $3::int) c
    ),
    ${CLAIMED_FROM_PICKED},
    -- The priorities each group looked at holds queued runs at (priorityWalk).
    ${GROUP_PRIORITIES},
    -- Per group looked at: the runs it started and its new due time. Its
    -- next queued run (of any version: another worker may host it) is one
    -- probe of runs_queued_key_idx per priority it holds.
    group_next as (
      select g.tenant_id, g.workflow_name, g.concurrency_key,
             coalesce(n.taken, 0) as taken,
             case when not exists (select 1 from concurrency_slots x where x.ctid = g.at)
                  then now()
                  else greatest(now(), coalesce((
                         select min(y.run_after) from group_priorities p
                          cross join lateral (
                                select r.run_after from runs r
                                 where r.tenant_id collate "C" = g.tenant_id
                                   and r.workflow_name = g.workflow_name
                                   and r.concurrency_key = g.concurrency_key
                                   and r.status = 'queued' and r.concurrency_key is not null
                                   and r.priority = p.priority
                                   and not exists (select 1 from claimed c
                                                    where c.tenant_id = r.tenant_id
                                                      and c.run_id = r.run_id)
                                 order by r.run_after
                                 limit 1) y
                          where p.tenant_id = g.tenant_id and p.workflow_name = g.workflow_name
                            and p.concurrency_key = g.concurrency_key), 'infinity')) end as due_at
        from groups g
        left join (select tenant_id, workflow_name, concurrency_key, count(*)::int as taken
                     from claimed group by 1, 2, 3) n
          on n.tenant_id = g.tenant_id and n.workflow_name = g.workflow_name
         and n.concurrency_key = g.concurrency_key
    ),
    -- Moves each group's counts and due time, on the newest version (the one
    -- locked, maybe newer than the snapshot): updateThroughKey.
    served_groups as (
      ${GROUPS_SERVED}
         set running = concurrency_slots.running + (${groupNext("taken")}),
             queued = concurrency_slots.queued - (${groupNext("taken")}),
             due_at = (${groupNext("due_at")}),
             served_at = now()
    ),
    ${STARTED_EVENTS_OF_CLAIMED}`;

/**
 * Claims up to `limit` due queued runs of the `hosted` versions that declare
 * a concurrency limit (migration 011), never more running at once per
 * concurrency group (tenant, workflow, key) than the group's limit, however
 * many workers claim and whatever their statements' snapshots: a group is
 * claimed from only while this statement holds its `concurrency_slots` row
 * (`FOR UPDATE SKIP LOCKED`), its room is read from that newest row, and the
 * row's counts move in the same statement as the runs.
 *
 * Who has due work: the groups with room and queued runs whose `due_at`
 * (migration 016, never later than their earliest queued run) has come, per
 * hosted workflow one range of `concurrency_slots_due_idx` in due order, the
 * first `limit` of them. The slots go round those groups (one run of each,
 * then a second of each, ...), a group starting its runs highest priority
 * first, then oldest. Each group looked at goes to the back of the line
 * (`due_at = now()`) while a due run is left, else to its next run's
 * run_after ('infinity' when none is queued); a group whose row changed
 * since this statement's snapshot (a run queued that the snapshot cannot
 * see) goes to now(), never later. Groups whose runs are not due, full
 * groups and their backlogs are never read. Fair across groups, not
 * tenants: a tenant with more due groups gets more of the slots. Sent
 * unprepared, as `claimRuns` is (`claimUnprepared`).
 */
export async function claimLimitedRuns(
  sql: Sql,
  owner: string,
  limit: number,
  leaseMs: number,
  hosted: HostedVersions,
): Promise<ClaimedRun[]> {
  return await claimUnprepared(sql, CLAIM_LIMITED_RUNS, owner, limit, leaseMs, hosted);
}

/** `group_next`'s `col` for the group an upsert of concurrency_slots proposed. */
function groupNext(col: string): string {
  return `select n.${col} from group_next n
           where n.tenant_id = excluded.tenant_id and n.workflow_name = excluded.workflow_name
             and n.concurrency_key = excluded.concurrency_key`;
}
