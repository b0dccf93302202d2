/**
 * The queue page's runs held back by concurrency limits: the tenant's
 * groups at their limit with runs queued (most queued first, at most
 * db/concurrency_overview.ts's
 * `WAITING_GROUPS_SHOWN`), and totals. Its own file, so the queue page
 * grows by one line.
 */
import { COUNT_CAP } from "../../db/queue_overview.ts";
import type { WaitingGroup, WaitingTotals } from "../../db/concurrency_overview.ts";

function count(n: number): string {
  return n >= COUNT_CAP ? `${COUNT_CAP}+` : String(n);
}

/** The tenant's concurrency groups at their limit with queued runs. */
export function ConcurrencyWaiting({ groups, totals }: {
  groups: WaitingGroup[];
  totals: WaitingTotals;
}) {
  return (
    <>
      <h2>Waiting on a concurrency limit</h2>
      {groups.length === 0
        ? <p class="muted" id="no-concurrency-waiting">No run waits on a concurrency limit.</p>
        : (
          <>
            <p id="concurrency-totals">
              <strong id="concurrency-waiting-runs">{count(totals.runs)}</strong> queued runs in
              {" "}
              <strong id="concurrency-full-groups">{count(totals.groups)}</strong>{" "}
              groups at their limit
              {totals.groups > groups.length
                ? <span class="muted">{` (the ${groups.length} with the most queued shown)`}</span>
                : ""}
            </p>
            <table id="concurrency-waiting">
              <thead>
                <tr>
                  <th>Workflow</th>
                  <th>Key</th>
                  <th>Limit</th>
                  <th>Running</th>
                  <th>Queued</th>
                </tr>
              </thead>
              <tbody>
                {groups.map((g) => (
                  <tr data-workflow={g.workflow} data-key={g.key}>
                    <td class="mono">{g.workflow}</td>
                    <td class="mono">
                      {g.key === "" ? <span class="muted">(per tenant)</span> : g.key}
                    </td>
                    <td>{String(g.limit)}</td>
                    <td>{String(g.running)}</td>
                    <td>{String(g.queued)}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </>
        )}
    </>
  );
}
