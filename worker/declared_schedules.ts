/**
 * The schedules a worker's workflows declare (`schedules` of
 * `defineWorkflow`), written when it registers its versions: for each
 * workflow it hosts, its newest hosted version's declarations, one schedule
 * per tenant each names (db/schedules.ts `syncDeclaredSchedules`, which does
 * nothing when a newer version of the workflow is registered: the newest
 * registered version decides). Any number of workers starting at once write
 * each schedule once; a worker restarting rewrites nothing that changed.
 */
import type { Logger } from "../core/log.ts";
import { nextOccurrence } from "../core/cron.ts";
import type { CatalogVersion } from "../db/catalog.ts";
import type { Sql } from "../db/pool.ts";
import {
  databaseNow,
  type DeclaredOutcome,
  type DeclaredRow,
  syncDeclaredSchedules,
} from "../db/schedules.ts";

/**
 * Writes the declared schedules of the newest of `versions` of each
 * workflow, logging what changed (and, as a warning, an id the tenant
 * already uses for another schedule); resolves with every outcome.
 */
export async function writeDeclaredSchedules(
  sql: Sql,
  versions: readonly CatalogVersion[],
  log: Logger,
): Promise<DeclaredOutcome[]> {
  const newest = new Map<string, CatalogVersion>();
  for (const v of versions) {
    const seen = newest.get(v.name);
    if (!seen || seen.version < v.version) newest.set(v.name, v);
  }
  // Each cursor starts at the first occurrence from the database's now: a
  // schedule declared today does not catch up on yesterday.
  const now = new Date((await databaseNow(sql)).getTime() - 1);
  const all: DeclaredOutcome[] = [];
  for (const v of newest.values()) {
    const rows: DeclaredRow[] = (v.schedules ?? []).flatMap((s) => {
      const next_at = nextOccurrence(s.cron, s.timezone, now);
      return s.tenants.map((tenant) => ({
        tenant_id: tenant,
        schedule_id: s.id,
        cron: s.cron,
        timezone: s.timezone,
        input: s.input,
        overlap: s.overlap,
        catchup: s.catchup,
        next_at,
      }));
    });
    const outcomes = await syncDeclaredSchedules(sql, v.name, v.version, rows);
    for (const o of outcomes) {
      const fields = {
        workflow: `${v.name}@${v.version}`,
        tenant: o.tenant_id,
        schedule: o.schedule_id,
      };
      if (o.outcome === "taken") {
        log.warn(
          "declared schedule not written: the tenant has another schedule with its id",
          fields,
        );
      } else if (o.outcome === "no-tenant") {
        // Written by the next worker start once the tenant exists.
        log.warn("declared schedule not written: no such tenant", fields);
      } else if (o.outcome !== "unchanged") {
        log.info(`declared schedule ${o.outcome}`, fields);
      }
    }
    all.push(...outcomes);
  }
  return all;
}
