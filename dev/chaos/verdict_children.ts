/**
 * The chaos invariants of child runs (dev/chaos/plan.ts' PARENT), held
 * against each parent's children as Postgres holds them
 * (dev/chaos/parent_runs.ts). Pure, like dev/chaos/verdict.ts, whose
 * summary they join.
 *
 * A parent killed while starting its children, or while waiting for them,
 * is retried; its children are admitted under keys derived from it, so the
 * retry finds them instead of starting others. A second child for one
 * place, a child missing from a finished parent, and a parent left waiting
 * once all its children are final are what must never happen.
 */
import type { Plan } from "./plan.ts";
import type { ParentRun } from "./parent_runs.ts";

/** The counters of parents and children, in the order the summary line prints them. */
export const CHILDREN_COUNTERS = [
  /** More children than the parent starts, or two children for one place (`j`). */
  "children_dup",
  /**
   * A succeeded parent without one of its children, with a child not
   * succeeded, or whose result is not built from its children's outputs.
   */
  "children_lost",
  /** A parent still waiting, queued or running once all its children are final. */
  "parents_waiting",
] as const;
export type ChildrenCounter = typeof CHILDREN_COUNTERS[number];

/** What the parents did that is no violation. */
export interface ChildrenInfo {
  parents: number;
  succeeded: number;
  children: number;
  /** Parents that waited (suspended) at least once, and their waits in all. */
  waitedParents: number;
  waits: number;
}

/** The parents' line of the chaos report. */
export function describeChildren(workflow: string, c: ChildrenInfo): string {
  return `${workflow}: ${c.parents} parents (${c.succeeded} succeeded) with ${c.children} ` +
    `children, ${c.waitedParents} waited for them (${c.waits} waits)`;
}

type Flag = (counter: ChildrenCounter, tenant: string, text: string) => void;

const FINAL = new Set(["succeeded", "failed", "cancelled"]);

/** Checks every parent of `parents` against `plan`, flagging what is wrong. */
export function checkChildren(plan: Plan, parents: ParentRun[], flag: Flag): ChildrenInfo {
  const info: ChildrenInfo = {
    parents: parents.length,
    succeeded: 0,
    children: 0,
    waitedParents: 0,
    waits: 0,
  };
  const planned = new Map<string, number>();
  for (const m of plan.messages) {
    if (m.kind === "fresh" && m.children !== undefined) {
      planned.set(`${m.tenant}/${m.dispatchKey}`, m.children);
    }
  }
  for (const p of parents) {
    const label = `parent ${p.runId} (${p.dispatchKey})`;
    const mapped = planned.get(`${p.tenant}/${p.dispatchKey}`);
    info.children += p.children.length;
    if (p.waited > 0) info.waitedParents++;
    info.waits += p.waited;
    if (mapped === undefined) {
      flag("children_lost", p.tenant, `${label}: no planned message starts this parent`);
      continue;
    }
    // The map's children are j = 0…mapped-1, the lone one j = mapped.
    const expected = mapped + 1;
    if (p.children.length > expected) {
      flag(
        "children_dup",
        p.tenant,
        `${label}: ${p.children.length} children, ${expected} started`,
      );
    }
    const byJ = new Map<number | null, number>();
    for (const c of p.children) byJ.set(c.j, (byJ.get(c.j) ?? 0) + 1);
    for (const [j, n] of byJ) {
      if (n > 1) flag("children_dup", p.tenant, `${label}: ${n} children for place ${j}`);
    }
    const open = !FINAL.has(p.status);
    if (open && p.children.length > 0 && p.children.every((c) => FINAL.has(c.status))) {
      flag(
        "parents_waiting",
        p.tenant,
        `${label}: still ${p.status} with all ${p.children.length} children final`,
      );
    }
    if (p.status !== "succeeded") continue;
    info.succeeded++;
    for (let j = 0; j < expected; j++) {
      if (!byJ.has(j)) flag("children_lost", p.tenant, `${label}: succeeded without child ${j}`);
    }
    const failed = p.children.filter((c) => c.status !== "succeeded");
    if (failed.length > 0) {
      flag(
        "children_lost",
        p.tenant,
        `${label}: succeeded with ${failed.length} children not succeeded (${failed[0].status})`,
      );
    }
    const js = (p.result as { js?: unknown } | null)?.js;
    const want = Array.from({ length: expected }, (_, j) => j);
    if (JSON.stringify(js) !== JSON.stringify(want)) {
      flag(
        "children_lost",
        p.tenant,
        `${label}: result ${JSON.stringify(js)}, not its children's ${JSON.stringify(want)}`,
      );
    }
  }
  // Not flagged when no parent waited: children that finish within the
  // workers' WORKER_SUSPEND_AFTER_MS never suspend their parent; the
  // report's line says how many did.
  return info;
}
