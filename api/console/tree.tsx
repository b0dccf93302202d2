/**
 * A run's place in its tree on its console page (child runs, issue 31):
 * its parent and root as links, whether it is detached, and its children
 * with their status: the first page of them, the rest a link to the runs
 * list filtered by parent. Rendered with hono's JSX, which escapes every
 * value (a child's name is whatever its parent's handler chose).
 */
import type { Run } from "../../contracts/runs.ts";
import { CHILD_KEY_PREFIX } from "../../contracts/runs.ts";

/** A child as its parent's page lists it. */
export interface TreeChild {
  run_id: string;
  status: string;
  dispatch_key: string | null;
}

// The call's name in the parent: the child's key is `child:<parent uuid>:<name>`.
function childName(key: string | null): string {
  return key?.startsWith(CHILD_KEY_PREFIX) ? key.slice(CHILD_KEY_PREFIX.length + 37) : "—";
}

function RunLink({ id, runId }: { id: string; runId: string }) {
  return <a class="mono" id={id} href={`/console/runs/${runId}`}>{runId}</a>;
}

/** The tree section; nothing for a run with neither parent nor children. */
export function RunTree({ run, listed, more }: {
  run: Run;
  /** Its children, the first page (not `children`: JSX's own prop). */
  listed: TreeChild[];
  /** Whether it has more children than listed. */
  more: boolean;
}) {
  if (run.parent_run_id === null && listed.length === 0) return null;
  return (
    <section id="run-tree">
      <h2>Tree</h2>
      <dl class="facts">
        <dt>Parent</dt>
        <dd>
          {run.parent_run_id === null
            ? <span class="muted">— (a root)</span>
            : <RunLink id="run-parent" runId={run.parent_run_id} />}
          {run.detached ? <span class="muted" id="run-detached"> detached</span> : ""}
        </dd>
        {run.root_run_id !== null && run.root_run_id !== run.parent_run_id
          ? (
            <>
              <dt>Root</dt>
              <dd>
                <RunLink id="run-root" runId={run.root_run_id} />
              </dd>
            </>
          )
          : ""}
      </dl>
      {listed.length === 0 ? <p class="muted">No children.</p> : (
        <table id="run-children">
          <thead>
            <tr>
              <th>Name</th>
              <th>Child run</th>
              <th>Status</th>
            </tr>
          </thead>
          <tbody>
            {listed.map((c) => (
              <tr data-run-id={c.run_id}>
                <td class="mono">{childName(c.dispatch_key)}</td>
                <td>
                  <a class="mono" href={`/console/runs/${c.run_id}`}>{c.run_id}</a>
                </td>
                <td>
                  <span class={`status status-${c.status}`} data-status={c.status}>
                    {c.status}
                  </span>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {more
        ? (
          <p>
            <a id="run-children-more" href={`/console/runs?parent_run_id=${run.run_id}`}>
              All its children
            </a>
          </p>
        )
        : ""}
    </section>
  );
}
