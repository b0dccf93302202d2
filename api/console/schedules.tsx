/**
 * The console's schedules page: the tenant's schedules (`/v1/schedules`),
 * each with its cron and zone, its next occurrences (UTC), its policies,
 * whether it is paused, where it comes from (made at run time, or declared
 * by a workflow's definition) and the run of its last occurrence.
 */
import type { Schedule } from "../../contracts/schedules.ts";

/** At most this many schedules on the page (the API pages through the rest). */
export const CONSOLE_SCHEDULES = 500;

function when(at: string) {
  return <time datetime={at}>{at.replace("T", " ").replace(/\.\d+Z$/, "Z")}</time>;
}

/** The schedules page's content. */
export function SchedulesFragment({ tenant, schedules, more }: {
  tenant: string;
  schedules: Schedule[];
  /** The tenant has more than are shown. */
  more: boolean;
}) {
  return (
    <section>
      <h1>Schedules</h1>
      <p class="tenant">
        Tenant <strong id="tenant">{tenant}</strong>
      </p>
      <p class="muted">
        Each occurrence starts one run, with the dispatch key{" "}
        <span class="mono">schedule:&lt;id&gt;:&lt;UTC instant&gt;</span>. A schedule declared in a
        workflow's definition changes with a new version of it; here (or with{" "}
        <span class="mono">PATCH /v1/schedules/&lt;id&gt;</span>) it can be paused and resumed.
      </p>
      {schedules.length === 0
        ? <p class="muted" id="no-schedules">This tenant has no schedule.</p>
        : (
          <table id="schedules">
            <thead>
              <tr>
                <th>Schedule</th>
                <th>Workflow</th>
                <th>Cron</th>
                <th>Next occurrences (UTC)</th>
                <th>Overlap / catch-up</th>
                <th>Origin</th>
                <th>Last run</th>
              </tr>
            </thead>
            <tbody>
              {schedules.map((s) => (
                <tr data-schedule={s.id} data-origin={s.origin} data-paused={String(s.paused)}>
                  <td class="mono">{s.id}</td>
                  <td class="mono">{s.workflow_ref}</td>
                  <td>
                    <span class="mono">{s.cron}</span> <span class="muted">{s.timezone}</span>
                  </td>
                  <td class="next">
                    {s.paused
                      ? <span class="status status-cancelled">paused</span>
                      : s.next_occurrences.map((at, i) => (
                        <>
                          {i > 0 ? <br /> : ""}
                          {when(at)}
                        </>
                      ))}
                  </td>
                  <td>{s.overlap} / {s.catchup}</td>
                  <td>
                    {s.origin === "definition"
                      ? (
                        <>
                          definition <span class="mono muted">{s.declared_by}</span>
                        </>
                      )
                      : "API"}
                  </td>
                  <td>
                    {s.last_run_id === null
                      ? <span class="muted">—</span>
                      : <a href={`/console/runs/${s.last_run_id}`}>{s.last_run_id}</a>}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      {more
        ? (
          <p class="muted" id="more-schedules">
            The first {String(CONSOLE_SCHEDULES)} by id; the rest: GET /v1/schedules.
          </p>
        )
        : ""}
    </section>
  );
}
