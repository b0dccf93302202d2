/**
 * The chaos invariants of durable runs (dev/chaos/plan.ts' DURABLE), held
 * against the calls their steps recorded through their own connection and
 * the steps poimen stored (dev/chaos/step_calls.ts). Pure, like
 * dev/chaos/verdict.ts, whose summary they join.
 *
 * A step's function may run more than once only while its result is not
 * stored: a worker killed (or a connection cut) between the function's side
 * effect and the store runs it again on the next try, which is the
 * documented contract (make such effects idempotent with `ctx.stepKey`).
 * Those re-runs are counted, not flagged. A call after the result was
 * stored is the duplicate that must never happen.
 */
import type { Plan } from "./plan.ts";
import type { DurableRun } from "./step_calls.ts";

/** The counters of durable runs, in the order the summary line prints them. */
export const DURABLE_COUNTERS = [
  /** A step's function called again after its result was stored. */
  "steps_dup",
  /**
   * A finished run's step without a stored result or without a call, a
   * stored result that is none of its calls, a run result that is not the
   * stored one, a planned durable key without a run of the durable workflow.
   */
  "steps_lost",
  /**
   * A sleep that ended before its end, a finished run whose suspensions were
   * not all woken, a finished run without its sleep, or no run suspended at
   * all (the suspension went unexercised).
   */
  "sleeps",
] as const;
export type DurableCounter = typeof DURABLE_COUNTERS[number];

/** What the durable runs did that is no violation. */
export interface DurableInfo {
  runs: number;
  succeeded: number;
  /** Runs suspended at least once, and suspensions in all. */
  suspendedRuns: number;
  suspensions: number;
  /** Step calls in all, and calls of a step beyond its first made before its result was stored. */
  calls: number;
  reruns: number;
}

/** The durable runs' line of the chaos report. */
export function describeDurable(workflow: string, d: DurableInfo): string {
  return `${workflow}: ${d.runs} runs (${d.succeeded} succeeded), ${d.suspendedRuns} suspended ` +
    `(${d.suspensions} suspensions); ${d.calls} step calls, ${d.reruns} re-runs of a step ` +
    `interrupted before its result was stored`;
}

type Flag = (counter: DurableCounter, tenant: string, text: string) => void;

const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

/** Checks every durable run of `runs` against `plan`, flagging what is wrong. */
export function checkDurable(plan: Plan, runs: DurableRun[], flag: Flag): DurableInfo {
  const { steps, sleep } = plan.durable;
  const info: DurableInfo = {
    runs: runs.length,
    succeeded: 0,
    suspendedRuns: 0,
    suspensions: 0,
    calls: 0,
    reruns: 0,
  };
  const byKey = new Map(runs.map((r) => [`${r.tenant}/${r.dispatchKey}`, r]));
  for (const m of plan.messages) {
    if (m.kind !== "fresh" || m.sleepMs === undefined) continue;
    if (!byKey.has(`${m.tenant}/${m.dispatchKey}`)) {
      flag("steps_lost", m.tenant, `key ${m.dispatchKey}: no run of ${plan.durable.workflow}`);
    }
  }

  for (const r of runs) {
    const label = `run ${r.runId} (${r.dispatchKey})`;
    const succeeded = r.status === "succeeded";
    if (succeeded) info.succeeded++;
    if (r.suspended > 0) info.suspendedRuns++;
    info.suspensions += r.suspended;
    info.calls += r.calls.length;
    const result = (r.result ?? {}) as Record<string, unknown>;

    for (const name of steps) {
      const calls = r.calls.filter((c) => c.step === name);
      const stored = r.steps.find((s) => s.name === name && s.kind === "step");
      const done = stored?.status === "completed" && stored.completedAt !== null
        ? stored
        : undefined;
      if (done) {
        const late = calls.filter((c) => c.at > done.completedAt!);
        for (const c of late) {
          flag(
            "steps_dup",
            r.tenant,
            `${label}: step ${name} called again (call ${c.id}, attempt ${c.attempt}) ` +
              `${Math.round(c.at - done.completedAt!)} ms after its result was stored`,
          );
        }
        info.reruns += Math.max(0, calls.length - late.length - 1);
        if (!calls.some((c) => c.id === done.result)) {
          flag(
            "steps_lost",
            r.tenant,
            `${label}: step ${name} stored ${JSON.stringify(done.result)}, ` +
              `none of its calls (${calls.map((c) => c.id)})`,
          );
        }
      } else info.reruns += Math.max(0, calls.length - 1);
      if (!succeeded) continue;
      if (!done) flag("steps_lost", r.tenant, `${label}: succeeded without step ${name} stored`);
      else if (calls.length === 0) {
        flag("steps_lost", r.tenant, `${label}: step ${name} stored, but never called`);
      } else if (result[name] !== done.result) {
        flag(
          "steps_lost",
          r.tenant,
          `${label}: result says ${name} = ${JSON.stringify(result[name])}, ` +
            `the stored step ${JSON.stringify(done.result)}`,
        );
      }
    }

    const slept = r.steps.find((s) => s.name === sleep && s.kind === "sleep");
    if (
      slept?.completedAt != null && slept.until !== null && slept.completedAt < slept.until
    ) {
      flag(
        "sleeps",
        r.tenant,
        `${label}: sleep ended ${Math.round(slept.until - slept.completedAt)} ms before its end`,
      );
    }
    if (FINISHED.has(r.status) && r.woken !== r.suspended) {
      flag(
        "sleeps",
        r.tenant,
        `${label}: ${r.status} after ${r.suspended} suspensions but ${r.woken} wake-ups`,
      );
    }
    if (succeeded && slept?.status !== "completed") {
      flag("sleeps", r.tenant, `${label}: succeeded without its sleep completed`);
    }
  }
  if (runs.length > 0 && info.suspendedRuns === 0) {
    flag("sleeps", "", `none of ${runs.length} durable runs suspended: suspension unexercised`);
  }
  return info;
}
