/**
 * The leader's lock: a session-level advisory lock, one per role, held by
 * the one process of the fleet that runs the role's maintenance (as River
 * elects its leader). Held for as long as the session lives: released by
 * `releaseLeaderLock`, or by Postgres when the connection ends. These run on
 * one reserved connection (core/leader.ts), never on a pooled one: a lock
 * left on a pooled connection would be held by whatever borrows it next.
 */
import type { Sql } from "./pool.ts";

// The advisory lock's first key, fixed for poimen ("poim"): the second key is
// the role, so other applications' advisory locks on the database do not
// collide with these.
const LOCK_SPACE = 0x706f696d;

/** The roles a leader is elected for, each its own lock. */
const LEADER_ROLES = {
  /** Among workers: the reclaimer's scan, the queue gauges, reconcilers. */
  worker: 1,
  /** Among outbox processes: the purge of published events and of finished runs. */
  outbox: 2,
} as const;

export type LeaderRole = keyof typeof LEADER_ROLES;

/** Takes `role`'s lock for this session if free (or already this session's); whether it did. */
export async function tryLeaderLock(conn: Sql, role: LeaderRole): Promise<boolean> {
  const [{ got }] = await conn<{ got: boolean }[]>`
    select pg_try_advisory_lock(${LOCK_SPACE}::int, ${LEADER_ROLES[role]}::int) as got`;
  return got;
}

/**
 * Whether this session holds `role`'s lock: false on a session that is not
 * the one that took it (a pool that reconnected behind the caller's back).
 */
export async function holdsLeaderLock(conn: Sql, role: LeaderRole): Promise<boolean> {
  const [{ held }] = await conn<{ held: boolean }[]>`
    select exists (select 1 from pg_locks
                    where locktype = 'advisory' and pid = pg_backend_pid() and granted
                      and classid = ${LOCK_SPACE}::int::oid
                      and objid = ${LEADER_ROLES[role]}::int::oid and objsubid = 2) as held`;
  return held;
}

/** Gives `role`'s lock up (taken once per session: `tryLeaderLock` is not asked again while held). */
export async function releaseLeaderLock(conn: Sql, role: LeaderRole): Promise<void> {
  await conn`select pg_advisory_unlock(${LOCK_SPACE}::int, ${LEADER_ROLES[role]}::int)`;
}

/** The backend holding `role`'s lock, if any (for operators and tests). */
export async function leaderBackend(sql: Sql, role: LeaderRole): Promise<number | undefined> {
  const [row] = await sql<{ pid: number }[]>`
    select pid from pg_locks
     where locktype = 'advisory' and granted
       and classid = ${LOCK_SPACE}::int::oid
       and objid = ${LEADER_ROLES[role]}::int::oid and objsubid = 2`;
  return row?.pid;
}
