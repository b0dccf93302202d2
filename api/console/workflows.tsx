/**
 * The console's workflows page: the versions the tenant may start, by
 * workflow, which one a run naming only the workflow gets (its current
 * version, migration 018), and how many live workers host each. A version
 * for other tenants only is left out, as admission never names it to this
 * tenant; workers are counted, not named (their ids name hosts, which are
 * the operators' to know: `deno task workflow list` shows them).
 */
import { parseTenantScope } from "../../contracts/tenant_scope.ts";
import type { VersionListing } from "../../db/workflow_current.ts";
import { bareNameVersion } from "../../admission/catalog.ts";

/** One version as the page shows it to a tenant. */
export interface TenantVersion {
  name: string;
  version: number;
  /** What this tenant's runs naming only the workflow get. */
  current: boolean;
  /** Only some tenants may start it (this one among them). */
  scoped: boolean;
  concurrency_limit: number | null;
  concurrency_key: string | null;
  registered_at: Date;
  liveWorkers: number;
}

/**
 * The versions of `listing` that `tenant` may start, by name and version,
 * each marked current when a run of this tenant naming only the workflow gets
 * it: the workflow's current version, or the newest older one the tenant may
 * start (as admission resolves it, admission/catalog.ts).
 */
export function tenantVersions(listing: VersionListing[], tenant: string): TenantVersion[] {
  const allows = (v: VersionListing) => {
    if (v.tenants === null) return true;
    const { scope } = parseTenantScope(v.tenants);
    return scope !== undefined && scope.allows(tenant);
  };
  const byName = new Map<string, VersionListing[]>();
  for (const v of listing) byName.set(v.name, [...byName.get(v.name) ?? [], v]);
  const shown: TenantVersion[] = [];
  for (const [, versions] of byName) {
    const newestFirst = [...versions].sort((a, b) => b.version - a.version);
    const current = newestFirst.find((v) => v.current);
    const gets = current ? bareNameVersion(newestFirst, current.version, allows) : undefined;
    for (const v of versions.filter(allows).sort((a, b) => a.version - b.version)) {
      shown.push({
        name: v.name,
        version: v.version,
        current: v === gets,
        scoped: v.tenants !== null,
        concurrency_limit: v.concurrency_limit,
        concurrency_key: v.concurrency_key,
        registered_at: v.registered_at,
        liveWorkers: v.workers.length,
      });
    }
  }
  return shown.sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : a.version - b.version);
}

function iso(at: Date): string {
  return at.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

/** The workflows page's content. */
export function WorkflowsFragment({ tenant, versions }: {
  tenant: string;
  versions: TenantVersion[];
}) {
  return (
    <section>
      <h1>Workflows</h1>
      <p class="tenant">
        Tenant <strong id="tenant">{tenant}</strong>
      </p>
      <p class="muted">
        A run naming only the workflow (<span class="mono">billing.invoice</span>) gets its current
        version; <span class="mono">billing.invoice@2</span>{" "}
        gets version 2. A new version becomes current only when an operator promotes it (
        <span class="mono">deno task workflow promote</span>): its workers starting or stopping
        changes nothing for runs naming only the workflow.
      </p>
      {versions.length === 0
        ? <p class="muted" id="no-workflows">No workflow is registered for this tenant yet.</p>
        : (
          <table id="workflows">
            <thead>
              <tr>
                <th>Workflow</th>
                <th>Version</th>
                <th>Current</th>
                <th>Live workers</th>
                <th>Concurrency</th>
                <th>Registered</th>
              </tr>
            </thead>
            <tbody>
              {versions.map((v) => (
                <tr
                  data-workflow={`${v.name}@${v.version}`}
                  data-current={v.current ? "true" : "false"}
                >
                  <td class="mono">{v.name}</td>
                  <td>
                    {String(v.version)}
                    {v.scoped ? " " : ""}
                    {v.scoped ? <span class="muted">(some tenants)</span> : ""}
                  </td>
                  <td>{v.current ? <span class="status status-current">current</span> : ""}</td>
                  <td class={v.liveWorkers === 0 ? "muted" : ""} data-live-workers={v.liveWorkers}>
                    {v.liveWorkers === 0 ? "none: its runs wait" : String(v.liveWorkers)}
                  </td>
                  <td class="mono">
                    {v.concurrency_limit === null
                      ? <span class="muted">—</span>
                      : `${v.concurrency_limit} per ${v.concurrency_key ?? "tenant"}`}
                  </td>
                  <td>
                    <time datetime={v.registered_at.toISOString()}>{iso(v.registered_at)}</time>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
    </section>
  );
}
