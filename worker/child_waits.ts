/**
 * Waiting for children (issue 31): a child handle's `result()` and
 * `ctx.map`, on db/fan_in.ts.
 *
 * A parent waits for a *group* of its children (one child's call name, or
 * a map's, whose children are `<name>#c<i>`): `awaitChildren` counts the
 * group's unfinished children under the parent's row lock and suspends the
 * parent with that count, or answers `ready`; the statement that makes the
 * last of them final (or, `failFast`, the first failure) queues the parent
 * again, and the replay reads the children's outcomes from their own rows.
 * Neither call stores the children's results in the parent: `result()` is
 * not a call of its own (a final child's outcome never changes), and a
 * map's step stores only its group and count, whatever the outputs weigh.
 * A map's step admits its first children (all, or `concurrency` of them),
 * the rest are admitted after it, each once by its key, up to
 * `concurrency` unfinished, waiting for half of them to end in between.
 */
import { notifyCancel } from "../db/notify.ts";
import type { Sql } from "../db/pool.ts";
import {
  awaitChildren,
  cancelChildren,
  childGroupState,
  type ChildOutcome,
  selectChild,
  selectChildOutcomes,
} from "../db/fan_in.ts";
import type { StepFence } from "../db/run_steps.ts";
import type { SuspendOutcome } from "../db/suspension.ts";
import { ChildRunFailed, type MapOptions } from "../workflows/durable.ts";
import type { ChildAdmission, ParentRun } from "./child_runs.ts";

/** What the waits need of the attempt's durable calls (worker/durable_context.ts). */
export interface ChildWaitHost {
  sql: Sql;
  fence: StepFence;
  run: ParentRun;
  children: ChildAdmission | undefined;
  /** Throws when the attempt is over for the durable calls. */
  live(): void;
  /** Runs a statement again while Postgres is unavailable (the durable calls' retry). */
  write<T>(fn: () => Promise<T>, events?: boolean): Promise<T>;
  /**
   * Suspends the run with `suspend`, or returns when it answered `ready`
   * (the caller looks again); throws `RunSuspended` once suspended.
   */
  suspend(
    suspend: () => Promise<SuspendOutcome>,
    wait: { name: string; step: string },
  ): Promise<void>;
  /** A replay that does not match the stored calls: fails the run for good. */
  diverged(detail: string): never;
  /** A durable `step` (its name, once per run); `fn` gets the step's key. */
  step<T>(name: string, fn: (stepKey: string) => Promise<T>): Promise<T>;
}

const FINAL: ReadonlySet<string> = new Set(["succeeded", "failed", "cancelled"]);
// Children admitted at once by a map: the kernel groups them into its flushes
// (admission/admit.ts, up to 500 rows a statement); this bounds the promises.
const ADMIT_CHUNK = 2_000;
// Cancels NOTIFYed to running children's workers at most (the rest see
// theirs at the next heartbeat).
const NOTIFY_MAX = 100;

/** The child's output, or its `ChildRunFailed` thrown. */
function outcome<O>(child: ChildOutcome, index?: number): O {
  if (child.status === "succeeded") return child.result as O;
  throw new ChildRunFailed({
    runId: child.run_id,
    name: child.name,
    workflow: `${child.workflow_name}@${child.workflow_version}`,
    status: child.status as "failed" | "cancelled",
    error: child.error,
    index,
  });
}

/** `result()` of the child `runId`: see the module comment. */
export async function childResult<O>(host: ChildWaitHost, runId: string): Promise<O> {
  const { tenant_id, run_id } = host.run;
  for (;;) {
    host.live();
    const child = await host.write(() => selectChild(host.sql, tenant_id, run_id, runId), false);
    if (!child) throw new TypeError(`result(): run ${runId} is not a child of run ${run_id}`);
    if (FINAL.has(child.status)) return outcome<O>(child);
    await host.suspend(
      () => awaitChildren(host.sql, host.fence, { group: child.name, failFast: false }),
      { name: child.name, step: child.name },
    );
  }
}

/** A map's call as the handler made it. */
export interface MapCall {
  name: string;
  definition: { name: string; version: number };
  inputs: readonly unknown[];
  options?: MapOptions;
}

/** `ctx.map`: see the module comment and workflows/durable.ts. */
export async function mapChildren<O>(host: ChildWaitHost, call: MapCall): Promise<O[]> {
  const { name, definition, inputs, options = {} } = call;
  const children = host.children;
  if (!children) throw new TypeError(`ctx.map ${name}: this worker cannot start child runs`);
  if (typeof definition?.name !== "string" || !Number.isInteger(definition.version)) {
    throw new TypeError(`ctx.map ${name}: definition must be a workflow definition`);
  }
  if (!Array.isArray(inputs)) throw new TypeError(`ctx.map ${name}: inputs must be an array`);
  const failFast = options.failFast ?? false;
  const concurrency = options.concurrency ?? Infinity;
  if (concurrency !== Infinity && (!Number.isInteger(concurrency) || concurrency < 1)) {
    throw new TypeError(`ctx.map ${name}: concurrency must be an integer >= 1`);
  }
  const { run } = host;
  const prefix = `${run.tenant_id}:${run.run_id}:`;
  const workflowRef = `${definition.name}@${definition.version}`;
  const admit = (group: string, from: number, to: number) =>
    admitRange(children, run, workflowRef, { group, inputs, from, to, priority: options.priority });
  // The step admits the first children (all, or `concurrency` of them): an
  // unknown workflow or a refused input fails it, clearly, as `start`'s. It
  // stores the group (the call's name) and the count, never the outputs;
  // the rest are admitted below, each once by its key.
  const { group, count } = await host.step(name, async (key) => {
    const group = key.slice(prefix.length);
    await admit(group, 0, Math.min(inputs.length, concurrency));
    return { group, count: inputs.length };
  });
  if (count !== inputs.length) {
    host.diverged(`map ${group} started ${count} children, and is made with ${inputs.length}`);
  }
  if (count === 0) return [];
  for (;;) {
    host.live();
    const state = await host.write(
      () => childGroupState(host.sql, run.tenant_id, run.run_id, group),
      false,
    );
    if (failFast && state.failed) break;
    // A gap below the last admitted (a crash amid a batch): admitted again, each once.
    if (state.admitted < state.last + 1) await admit(group, 0, state.last + 1);
    const room = Math.min(count - (state.last + 1), concurrency - state.open);
    if (room > 0) {
      await admit(group, state.last + 1, state.last + 1 + room);
      continue;
    }
    // All admitted: wait for every one. Some left: wait for room (half the bound), then admit.
    const more = state.last + 1 < count;
    const slack = more ? Math.floor(concurrency / 2) : 0;
    // Returns when there is nothing to wait for; else the run is suspended and this throws.
    await host.suspend(
      () => awaitChildren(host.sql, host.fence, { group, failFast, slack }),
      { name: group, step: group },
    );
    if (!more) break;
  }
  const rows = await host.write(
    () => selectChildOutcomes(host.sql, run.tenant_id, run.run_id, group),
    false,
  );
  const byIndex: (ChildOutcome | undefined)[] = new Array(count);
  for (const row of rows) {
    const i = Number(row.name.slice(group.length + 2));
    if (Number.isInteger(i) && i >= 0 && i < count) byIndex[i] = row;
  }
  const failed = byIndex.findIndex((c) =>
    c !== undefined && FINAL.has(c.status) &&
    c.status !== "succeeded"
  );
  if (failed >= 0) {
    if (failFast) await cancelRest(host, group);
    outcome(byIndex[failed]!, failed);
  }
  return byIndex.map((c, i) => {
    if (!c) throw new Error(`map ${group}: child ${i} was not found`);
    return outcome<O>(c, i);
  });
}

/** Admits children `from`..`to` - 1 of a map, together (the kernel's flushes group them). */
async function admitRange(
  children: ChildAdmission,
  run: ParentRun,
  workflowRef: string,
  r: { group: string; inputs: readonly unknown[]; from: number; to: number; priority?: number },
): Promise<void> {
  for (let i = r.from; i < r.to; i += ADMIT_CHUNK) {
    const end = Math.min(r.to, i + ADMIT_CHUNK);
    await Promise.all(
      r.inputs.slice(i, end).map((input, j) =>
        children.start(run, {
          name: `${r.group}#c${i + j}`,
          workflowRef,
          input,
          priority: r.priority,
        })
      ),
    );
  }
}

/** `failFast`: cancels the group's unfinished children, and tells their workers. */
async function cancelRest(host: ChildWaitHost, group: string): Promise<void> {
  const { tenant_id, run_id } = host.run;
  const running = await host.write(() => cancelChildren(host.sql, tenant_id, run_id, group));
  await Promise.all(
    running.slice(0, NOTIFY_MAX).map((id) => notifyCancel(host.sql, tenant_id, id)),
  );
}
