/**
 * The console's fragments: the tenant data of each page, rendered on the
 * server with hono's JSX, which escapes every text and attribute value. No
 * value reaches the page any other way (no raw HTML, no
 * dangerouslySetInnerHTML): a dispatch key, a goal id, an input or a result
 * is whatever a caller sent, and is shown as text.
 */
import type { Run, RunEvent } from "../../contracts/runs.ts";
import {
  COUNT_CAP,
  type MinuteCount,
  type TenantQueue,
  type WaitingVersion,
} from "../../db/queue_overview.ts";
import { BarChart } from "./chart.tsx";
import type { TenantQuota } from "../../db/tenant_quotas.ts";
import { QuotaUse } from "./quota_use.tsx";
import type { WaitingGroup, WaitingTotals } from "../../db/concurrency_overview.ts";
import { ConcurrencyWaiting } from "./concurrency_waiting.tsx";
import { DurableWait, signalable, SignalForm, StepTimeline } from "./durable.tsx";
import { RunTree, type TreeChild } from "./tree.tsx";

/** The run statuses a filter offers. */
export const STATUSES = [
  "queued",
  "running",
  "waiting",
  "succeeded",
  "failed",
  "cancelled",
] as const;

/** A run that can still be cancelled, and whose cancel was not asked for yet. */
function cancellable(run: Run): boolean {
  return (run.status === "queued" || run.status === "running" || run.status === "waiting") &&
    run.cancel_requested_at === null;
}

function Status({ status }: { status: string }) {
  return <span class={`status status-${status}`} data-status={status}>{status}</span>;
}

function When({ iso }: { iso: string | null }) {
  if (iso === null) return <span class="muted">—</span>;
  return <time datetime={iso}>{iso.replace("T", " ").replace(/\.\d+Z$/, "Z")}</time>;
}

function Json({ value, id }: { value: unknown; id: string }) {
  return <pre id={id}>{value === undefined ? "null" : JSON.stringify(value, null, 2)}</pre>;
}

function Tenant({ tenant }: { tenant: string }) {
  return (
    <p class="tenant">
      Tenant <strong id="tenant">{tenant}</strong>
    </p>
  );
}

/** The filters of the runs list, as the form and the links carry them. */
export interface RunsFilter {
  status?: string;
  /** A run's children (its page's "all its children" link). */
  parent_run_id?: string;
  goal_id?: string;
  dispatch_key?: string;
  limit?: number;
}

function filterParams(f: RunsFilter, cursor?: string): string {
  const p = new URLSearchParams();
  if (f.status) p.set("status", f.status);
  if (f.parent_run_id) p.set("parent_run_id", f.parent_run_id);
  if (f.goal_id) p.set("goal_id", f.goal_id);
  if (f.dispatch_key) p.set("dispatch_key", f.dispatch_key);
  if (f.limit) p.set("limit", String(f.limit));
  if (cursor) p.set("cursor", cursor);
  const s = p.toString();
  return s ? `?${s}` : "";
}

/** The runs list: filters, a page of runs, and links to the next page. */
export function RunsFragment({ tenant, filter, runs, nextCursor, paged }: {
  tenant: string;
  filter: RunsFilter;
  runs: Run[];
  nextCursor: string | null;
  /** Whether this page was reached through a cursor (so "newest" is offered). */
  paged: boolean;
}) {
  return (
    <section>
      <h1>Runs</h1>
      <Tenant tenant={tenant} />
      <form class="filters" id="filters" method="get" action="/console/runs">
        <label>
          Status
          <select name="status">
            <option value="" selected={!filter.status}>any</option>
            {STATUSES.map((s) => (
              <option key={s} value={s} selected={filter.status === s}>{s}</option>
            ))}
          </select>
        </label>
        <label>
          Goal
          <input name="goal_id" type="text" value={filter.goal_id ?? ""} />
        </label>
        <label>
          Dispatch key
          <input name="dispatch_key" type="text" value={filter.dispatch_key ?? ""} />
        </label>
        <button type="submit">Filter</button>
        <a href="/console/runs">Clear</a>
      </form>
      {runs.length === 0 ? <p class="muted" id="no-runs">No runs match.</p> : (
        <table id="runs">
          <thead>
            <tr>
              <th>Run</th>
              <th>Status</th>
              <th>Workflow</th>
              <th>Dispatch key</th>
              <th>Goal</th>
              <th>Attempts</th>
              <th>Admitted</th>
            </tr>
          </thead>
          <tbody>
            {runs.map((r) => (
              <tr key={r.run_id} data-run-id={r.run_id}>
                <td class="mono">
                  <a href={`/console/runs/${r.run_id}`}>{r.run_id}</a>
                </td>
                <td>
                  <Status status={r.status} />
                  {r.status === "running" && r.cancel_requested_at !== null
                    ? <span class="muted">cancelling</span>
                    : ""}
                </td>
                <td>{`${r.workflow}@${r.workflow_version}`}</td>
                <td class="mono dispatch-key">{r.dispatch_key ?? ""}</td>
                <td class="mono">{r.goal_id ?? ""}</td>
                <td>{`${r.attempts}/${r.max_attempts}`}</td>
                <td>
                  <When iso={r.created_at} />
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <p class="pager">
        {paged ? <a href={`/console/runs${filterParams(filter)}`}>Newest</a> : ""}
        {nextCursor === null
          ? ""
          : <a id="older" href={`/console/runs${filterParams(filter, nextCursor)}`}>Older runs</a>}
      </p>
    </section>
  );
}

/** What a queued run waits for; a concurrency limit with its key, limit and running runs. */
function WaitingFor({ waiting }: { waiting: NonNullable<Run["waiting_for"]> }) {
  if (waiting.reason === "sleep" || waiting.reason === "signal") {
    return <DurableWait waiting={waiting} />;
  }
  if (waiting.reason !== "concurrency") return <>{waiting.detail}</>;
  return (
    <>
      {"a concurrency limit: "}
      <span id="run-waiting-running">{String(waiting.running)}</span>
      {" of "}
      <span id="run-waiting-limit">{String(waiting.limit)}</span>
      {" running "}
      {waiting.key === "" ? "for this tenant" : (
        <>
          {"for key "}
          <span class="mono" id="run-waiting-key">{waiting.key}</span>
        </>
      )}
    </>
  );
}

/**
 * One run: what it is, its input, its result or error, and its event
 * timeline. `data-event-seq` is the seq of its last event (shown or purged):
 * where app.js resumes the run's event stream, so an event already shown
 * does not reload the fragment again.
 */
export function RunFragment({ tenant, run, events, eventSeq, tree }: {
  tenant: string;
  run: Run;
  events: RunEvent[];
  eventSeq: number;
  /** Its children (the first page) and whether it has more. */
  tree: { children: TreeChild[]; more: boolean };
}) {
  return (
    <section id="run" data-event-seq={String(eventSeq)} data-status={run.status}>
      <h1>
        Run <span class="mono" id="run-id">{run.run_id}</span>
      </h1>
      <Tenant tenant={tenant} />
      <dl class="facts">
        <dt>Status</dt>
        <dd id="run-status">
          <Status status={run.status} />{" "}
          {run.status === "running" && run.cancel_requested_at !== null
            ? <span class="muted" id="cancel-requested">cancel requested</span>
            : ""}
          {cancellable(run)
            ? (
              <button class="danger" type="button" id="cancel" data-cancel={run.run_id}>
                Cancel run
              </button>
            )
            : ""}
        </dd>
        <dt>Workflow</dt>
        <dd>{`${run.workflow}@${run.workflow_version} (asked: ${run.workflow_ref})`}</dd>
        <dt>Dispatch key</dt>
        <dd class="mono" id="dispatch-key">{run.dispatch_key ?? "—"}</dd>
        <dt>Goal</dt>
        <dd class="mono">{run.goal_id ?? "—"}</dd>
        <dt>Source</dt>
        <dd class="mono">{run.source}</dd>
        <dt>Attempts</dt>
        <dd>{`${run.attempts} of ${run.max_attempts}`}</dd>
        <dt>Admitted</dt>
        <dd>
          <When iso={run.created_at} />
        </dd>
        <dt>Due</dt>
        <dd id="run-due">
          <When iso={run.run_after} />
        </dd>
        {run.waiting_for
          ? (
            <>
              <dt>Waiting for</dt>
              <dd id="run-waiting-for" data-reason={run.waiting_for.reason}>
                <WaitingFor waiting={run.waiting_for} />
              </dd>
            </>
          )
          : ""}
        <dt>Started</dt>
        <dd>
          <When iso={run.started_at} />
        </dd>
        <dt>Finished</dt>
        <dd>
          <When iso={run.finished_at} />
        </dd>
      </dl>
      <h2>Input</h2>
      <Json id="run-input" value={run.input} />
      {run.error !== null
        ? (
          <>
            <h2>Error</h2>
            <Json id="run-error" value={run.error} />
          </>
        )
        : (
          <>
            <h2>Result</h2>
            <Json id="run-result" value={run.result} />
          </>
        )}
      <RunTree run={run} listed={tree.children} more={tree.more} />
      {run.steps?.length ? <StepTimeline steps={run.steps} /> : ""}
      {signalable(run) ? <SignalForm run={run} /> : ""}
      <h2>Events</h2>
      {events.length === 0
        ? <p class="muted">No events left: published events are purged after a while.</p>
        : (
          <table id="events">
            <thead>
              <tr>
                <th>#</th>
                <th>Type</th>
                <th>At</th>
                <th>Shipped</th>
                <th>Payload</th>
              </tr>
            </thead>
            <tbody>
              {events.map((e) => (
                <tr key={e.seq}>
                  <td>{String(e.seq)}</td>
                  <td class="mono">{e.type}</td>
                  <td>
                    <When iso={e.at} />
                  </td>
                  <td>
                    {e.parked_at !== null ? "parked" : <When iso={e.published_at} />}
                  </td>
                  <td class="mono">{JSON.stringify(e.payload)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
    </section>
  );
}

function count(n: number): string {
  return n >= COUNT_CAP ? `${COUNT_CAP}+` : String(n);
}

function age(seconds: number): string {
  if (seconds < 1) return "0 s";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

/** The versions the tenant's queued runs wait on that no live worker hosts. */
function WaitingVersions({ waiting }: { waiting: WaitingVersion[] }) {
  if (waiting.length === 0) {
    return <p class="muted" id="no-waiting">Every queued run's version has a worker.</p>;
  }
  return (
    <table id="waiting-for-worker">
      <thead>
        <tr>
          <th>Workflow</th>
          <th>Queued runs</th>
        </tr>
      </thead>
      <tbody>
        {waiting.map((v) => (
          <tr data-workflow={v.workflow}>
            <td class="mono">{v.workflow}</td>
            <td>{count(v.runs)}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/**
 * The queue at a glance: counts, the oldest due run's wait, the versions
 * waiting for a worker, the groups waiting on a concurrency limit,
 * admissions per minute.
 */
export function QueueFragment(
  { tenant, queue, waiting, perMinute, now, quota, limited }: {
    tenant: string;
    queue: TenantQueue;
    /** Its concurrency groups at their limit with queued runs, and their totals. */
    limited?: { groups: WaitingGroup[]; totals: WaitingTotals };
    /** The tenant's quotas (`deno task tenant`); none shown when it has none. */
    quota?: TenantQuota;
    /** Versions its queued runs wait on that no live worker hosts. */
    waiting: WaitingVersion[];
    /** Admissions per minute over the last hour (minutes without any absent). */
    perMinute: MinuteCount[];
    now: Date;
  },
) {
  const MINUTE = 60_000;
  const end = Math.floor(now.getTime() / MINUTE) * MINUTE;
  const byMinute = new Map(perMinute.map((m) => [new Date(m.minute).getTime(), m.runs]));
  const hhmm = (ms: number) => new Date(ms).toISOString().slice(11, 16);
  const bars = Array.from({ length: 60 }, (_, i) => {
    const t = end - (59 - i) * MINUTE;
    return { label: `${hhmm(t)} UTC`, value: byMinute.get(t) ?? 0 };
  });
  const total = bars.reduce((s, b) => s + b.value, 0);
  return (
    <section>
      <h1>Queue</h1>
      <Tenant tenant={tenant} />
      <div class="cards">
        <div class="card">
          <div class="value" id="queued">{count(queue.queued)}</div>
          <div class="label">queued ({count(queue.due)} due)</div>
        </div>
        <div class="card">
          <div class="value" id="running">{count(queue.running)}</div>
          <div class="label">running</div>
        </div>
        <div class="card">
          <div class="value" id="oldest-due">{age(queue.oldestDueSeconds)}</div>
          <div class="label">oldest due run has waited</div>
        </div>
        <div class="card">
          <div class="value" id="admitted-hour">{String(total)}</div>
          <div class="label">admitted in the last hour</div>
        </div>
      </div>
      <QuotaUse quota={quota} queued={queue.queued} />
      <h2>Waiting for a worker</h2>
      <WaitingVersions waiting={waiting} />
      {limited ? <ConcurrencyWaiting groups={limited.groups} totals={limited.totals} /> : ""}
      <h2>Runs admitted per minute, last hour</h2>
      <BarChart
        bars={bars}
        title="Runs admitted per minute over the last hour"
        first={`${hhmm(end - 59 * MINUTE)} UTC`}
        last={`${hhmm(end)} UTC`}
      />
    </section>
  );
}
