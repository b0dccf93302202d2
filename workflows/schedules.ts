/**
 * The schedules a definition declares (`schedules` of `defineWorkflow`),
 * checked where the definition is made: a bad id, cron, time zone, policy,
 * tenant list or input throws a `TypeError` naming the workflow and the
 * schedule, so a definition that could not schedule fails where it is
 * imported rather than at the first occurrence.
 *
 * Which tenants: a declared schedule exists once per tenant it names
 * (`tenants` of the entry), or else once per tenant of the definition's own
 * `tenants`. Prefixes (`team-*`) and a definition for every tenant name no
 * list of tenants, so such a definition must name them in the entry: a
 * schedule is work started without anyone asking, and a new tenant does not
 * get one by its id matching a pattern.
 */
import { cronProblem } from "../core/cron.ts";
import { SCHEDULE_ID_PATTERN } from "../contracts/schedules.ts";
import { parseTenantScope, type TenantScope } from "../contracts/tenant_scope.ts";
import { isTenantId } from "../contracts/topics.ts";
import type { DeclaredSchedule, Schema } from "../contracts/workflow.ts";

const OVERLAP = ["skip", "allow"];
const CATCHUP = ["skip", "latest", "all"];

/** At most this many schedules in one definition: declarations, not data. */
export const MAX_DECLARED_SCHEDULES = 100;

/**
 * `declared` checked, defaults applied and each one's tenants resolved;
 * undefined when there are none. `tenants` is the definition's own list
 * (already checked; undefined: every tenant); `input` its input schema.
 */
export function checkedSchedules(
  label: string,
  declared: unknown,
  tenants: readonly string[] | undefined,
  input: Schema,
): readonly DeclaredSchedule[] | undefined {
  if (declared === undefined) return undefined;
  if (!Array.isArray(declared)) {
    throw new TypeError(`workflow ${label}: schedules must be a list ([{ id, cron, input }])`);
  }
  if (declared.length > MAX_DECLARED_SCHEDULES) {
    throw new TypeError(`workflow ${label}: at most ${MAX_DECLARED_SCHEDULES} schedules`);
  }
  const scope = tenants === undefined ? undefined : parseTenantScope(tenants).scope;
  const ids = new Set<string>();
  const out = declared.map((entry: unknown, i) => {
    const s = checkedSchedule(label, i, entry, tenants, scope, input);
    if (ids.has(s.id)) throw new TypeError(`workflow ${label}: schedule ${s.id} declared twice`);
    ids.add(s.id);
    return s;
  });
  return out.length === 0 ? undefined : Object.freeze(out);
}

function checkedSchedule(
  label: string,
  index: number,
  entry: unknown,
  tenants: readonly string[] | undefined,
  scope: TenantScope | undefined,
  input: Schema,
): DeclaredSchedule {
  if (typeof entry !== "object" || entry === null || Array.isArray(entry)) {
    throw new TypeError(`workflow ${label}: schedules[${index}] must be { id, cron, input }`);
  }
  const e = entry as Record<string, unknown>;
  if (typeof e.id !== "string" || !SCHEDULE_ID_PATTERN.test(e.id)) {
    throw new TypeError(
      `workflow ${label}: schedules[${index}]: id must be 1–100 of A-Z a-z 0-9 . _ - ` +
        `(no colon), got ${JSON.stringify(e.id)}`,
    );
  }
  const where = `workflow ${label}: schedule ${e.id}`;
  const timezone = e.timezone ?? "UTC";
  if (typeof e.cron !== "string" || typeof timezone !== "string") {
    throw new TypeError(`${where}: cron and timezone must be strings`);
  }
  const problem = cronProblem(e.cron, timezone);
  if (problem) throw new TypeError(`${where}: ${problem}`);
  const overlap = e.overlap ?? "allow";
  if (!OVERLAP.includes(overlap as string)) {
    throw new TypeError(`${where}: overlap must be "skip" or "allow"`);
  }
  const catchup = e.catchup ?? "skip";
  if (!CATCHUP.includes(catchup as string)) {
    throw new TypeError(`${where}: catchup must be "skip", "latest" or "all"`);
  }
  const named = scheduleTenants(where, e.tenants, tenants, scope);
  let value: unknown;
  try {
    // What the occurrences send: JSON, null when absent.
    value = JSON.parse(JSON.stringify(e.input ?? null));
  } catch (err) {
    throw new TypeError(`${where}: input must be JSON (${(err as Error).message})`);
  }
  const parsed = input.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const path = ["input", ...issue.path.map(String)].join(".");
    throw new TypeError(`${where}: ${path}: ${issue.message}`);
  }
  return Object.freeze({
    id: e.id,
    cron: e.cron,
    timezone,
    input: value,
    overlap: overlap as DeclaredSchedule["overlap"],
    catchup: catchup as DeclaredSchedule["catchup"],
    tenants: named,
  });
}

/** The tenants a schedule exists for: its own list, else the definition's ids. */
function scheduleTenants(
  where: string,
  own: unknown,
  tenants: readonly string[] | undefined,
  scope: TenantScope | undefined,
): readonly string[] {
  if (own === undefined) {
    if (tenants === undefined || tenants.some((t) => !isTenantId(t))) {
      throw new TypeError(
        `${where}: name its tenants (tenants: ["acme"]): the definition's tenants ` +
          `${tenants === undefined ? "are every tenant" : "have a prefix"}, which lists none`,
      );
    }
    return Object.freeze([...tenants]);
  }
  if (!Array.isArray(own) || own.length === 0) {
    throw new TypeError(`${where}: tenants must be a non-empty list of tenant ids`);
  }
  for (const t of own) {
    if (typeof t !== "string" || !isTenantId(t)) {
      throw new TypeError(
        `${where}: tenants: ${JSON.stringify(t)} is not a tenant id ([a-z0-9_-]{1,63})`,
      );
    }
    if (scope !== undefined && !scope.allows(t)) {
      throw new TypeError(`${where}: tenant ${t} may not start this workflow (its tenants)`);
    }
  }
  return Object.freeze([...new Set(own as string[])].sort());
}
