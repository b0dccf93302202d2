/**
 * The chaos invariants, checked over what was asked for (the plan, the HTTP
 * callers' answers) and what was found (runs in Postgres, topics read back).
 * Pure: every input is plain data, so the checks are tested on their own
 * (tests/dev_chaos_verdict_test.ts).
 */
import type { Plan, PoisonKind, PoisonMessage } from "./plan.ts";
import type { RunRow, SlotGroup, UnpublishedEvent } from "./observe.ts";
import type { SlotSample } from "./sampler.ts";
import type { DurableRun } from "./step_calls.ts";
import { checkDurable, DURABLE_COUNTERS, type DurableInfo } from "./verdict_durable.ts";
import { checkLimits } from "./verdict_limits.ts";
import { checkChildren, CHILDREN_COUNTERS, type ChildrenInfo } from "./verdict_children.ts";
import type { ParentRun } from "./parent_runs.ts";

/** Every invariant, in the order the summary line prints them. */
export const COUNTERS = [
  /** A key (or keyless message) that must have made a run and did not, nor was dead-lettered. */
  "lost",
  /** More than one run for one key, or for one keyless message. */
  "dup",
  /** Runs still queued or running after the drain. */
  "stuck",
  /** Events neither published nor parked after the drain. */
  "unparked",
  /** Dispatch messages the relay group has not committed past after the drain. */
  "lag",
  /** Runs whose events on Kafka miss a seq (not parked), end without a terminal event, or are unknown. */
  "gaps",
  /** Runs whose events first appear on Kafka out of seq order. */
  "order",
  /** Poison with no dead letter, or dead-lettered with the wrong reason. */
  "dlq_missing",
  /** Dead letters of messages that must be admitted, and poison that was admitted. */
  "dlq_extra",
  /** HTTP callers that got no run, an error, or another run than the key's. */
  "http",
  /** Runs (echo, chaos.keyed, chaos.durable) that ended `failed` (they have nothing to fail on). */
  "failed",
  /** Processes that exited on their own (the harness restarts them, as an orchestrator would). */
  "crashes",
  /**
   * Samples in which a concurrency group of the limited workflow had more
   * runs running than its limit; also a run of it stored without its group
   * (never limited), and a run without a single sample (the limit unchecked).
   */
  "overlimit",
  /**
   * Groups whose `concurrency_slots` counts differ from their runs running
   * and queued: per sample during the run, per group after the drain (or
   * whose row's limit is not the definition's).
   */
  "slotdrift",
  /** Durable runs' steps and sleeps (dev/chaos/verdict_durable.ts). */
  ...DURABLE_COUNTERS,
  /** Parents and their children (dev/chaos/verdict_children.ts). */
  ...CHILDREN_COUNTERS,
  /** Violations above that concern the clean tenant. */
  "tenant_b",
] as const;
export type Counter = typeof COUNTERS[number];

/** Where the harness expects a poison message to go: the dead-letter reasons it accepts. */
// A keyless message is not poison: the relay derives its key from where it
// sits in Kafka, so it is admitted exactly once and never dead-lettered.
export const EXPECTED_REASONS: Record<
  Exclude<PoisonKind, "oversized-result" | "keyless">,
  string[]
> = {
  "bad-json": ["bad-json"],
  "unknown-workflow": ["unknown-workflow"],
  "nul-input": ["validation"],
  "oversized-body": ["body-too-large"],
};

const TERMINAL_EVENTS = new Set(["run.succeeded", "run.failed", "run.cancelled"]);
const OPEN = new Set(["queued", "running", "waiting"]);

/** One event as read back from an events topic. */
export interface EventSeen {
  tenant: string;
  runId: string;
  seq: number;
  type: string;
}

/** One dead letter as read back from a DLQ topic. */
export interface DeadLetterSeen {
  tenant: string;
  key: string;
  reason: string;
}

/** What one HTTP caller was told. */
export interface HttpAnswer {
  tenant: string;
  dispatchKey: string;
  runId?: string;
  status?: number;
  error?: string;
}

export interface Observed {
  runs: RunRow[];
  /** Events in the order read back (offset order within each partition). */
  events: EventSeen[];
  deadLetters: DeadLetterSeen[];
  /** Kafka key → how many messages with that key are on its tenant's dispatch topic. */
  dispatchCopies: Map<string, number>;
  unpublished: UnpublishedEvent[];
  http: HttpAnswer[];
  /** One line per process exit nobody asked for. */
  crashes: string[];
  /** `<topic>/<partition>` → messages the relay group has not committed past, after the drain. */
  uncommitted: Map<string, number>;
  /** The concurrency groups: sampled while the run lasted, and read once after the drain. */
  slots: { samples: SlotSample[]; failed: number; final: SlotGroup[] };
  /** The runs of the durable workflow, with their stored steps and recorded step calls. */
  durable: DurableRun[];
  /** The runs of the parent workflow, with their children. */
  parents: ParentRun[];
}

/** What the sampler saw of the limited workflow's groups: evidence the limit was exercised. */
export interface LimitInfo {
  samples: number;
  /** Samples whose query failed (a Postgres fault). */
  failedSamples: number;
  /** The most runs one group had running in one sample. */
  maxRunning: number;
  /** Samples in which some group was at its limit with runs waiting. */
  contended: number;
  /** Distinct groups seen. */
  groups: number;
}

export interface Verdict {
  counts: Record<Counter, number>;
  /** A few examples per counter that is not 0. */
  examples: Record<Counter, string[]>;
  /** Facts worth printing that are no violation. */
  info: {
    parked: number;
    deadLetters: number;
    runs: number;
    events: number;
    limited: LimitInfo;
    durable: DurableInfo;
    children: ChildrenInfo;
  };
}

const MAX_EXAMPLES = 5;

/** Checks every invariant; `clean` is the tenant that must stay unaffected. */
export function verdict(plan: Plan, seen: Observed, clean: string): Verdict {
  const counts = Object.fromEntries(COUNTERS.map((c) => [c, 0])) as Record<Counter, number>;
  const examples = Object.fromEntries(COUNTERS.map((c) => [c, [] as string[]])) as Record<
    Counter,
    string[]
  >;
  const flag = (counter: Counter, tenant: string, text: string, weight = 1) => {
    counts[counter] += weight;
    if (examples[counter].length < MAX_EXAMPLES) {
      examples[counter].push(tenant === "" ? text : `${tenant}: ${text}`);
    }
    if (tenant === clean && counter !== "tenant_b") flag("tenant_b", tenant, `${counter}: ${text}`);
  };

  const byKey = group(
    seen.runs.filter((r) => r.dispatchKey !== null),
    (r) => `${r.tenant}/${r.dispatchKey}`,
  );
  const byMarker = group(
    seen.runs.filter((r) => r.marker !== null),
    (r) => `${r.tenant}/${r.marker}`,
  );
  const letters = group(seen.deadLetters, (d) => d.key);
  const poisonByKey = new Map(plan.poison.map((m) => [m.key, m]));

  // Every key: exactly one run.
  for (const [tenant, keys] of plan.keys) {
    for (const key of keys) {
      const runs = byKey.get(`${tenant}/${key}`) ?? [];
      if (runs.length === 0) flag("lost", tenant, `key ${key}: no run`);
      if (runs.length > 1) {
        flag("dup", tenant, `key ${key}: ${runs.length} runs (${runs.map((r) => r.runId)})`);
      }
      const dead = letters.get(`${tenant}/${key}`);
      if (dead) {
        flag("dlq_extra", tenant, `key ${key} dead-lettered (${dead.map((d) => d.reason)})`);
      }
    }
  }

  // Every poison message: where its kind says it must go.
  for (const m of plan.poison) {
    if (m.kind === "oversized-result") continue; // a key like any other, above
    checkPoison(m, letters.get(m.key) ?? [], byKey, byMarker, seen.dispatchCopies, flag);
  }

  // Dead letters nobody planned (e.g. on the clean tenant under another key).
  for (const [key, dead] of letters) {
    const tenant = dead[0].tenant;
    const planned = poisonByKey.has(key) ||
      plan.keys.get(tenant)?.has(key.slice(tenant.length + 1));
    if (!planned) flag("dlq_extra", tenant, `unexpected dead letter ${key} (${dead[0].reason})`);
  }

  const oversized = new Set(
    plan.poison.filter((m) => m.kind === "oversized-result").map((m) =>
      `${m.tenant}/${m.dispatchKey}`
    ),
  );
  for (const r of seen.runs) {
    if (OPEN.has(r.status)) {
      flag("stuck", r.tenant, `run ${r.runId} (${r.dispatchKey ?? r.marker}) still ${r.status}`);
    }
    if (r.status === "failed" && !oversized.has(`${r.tenant}/${r.dispatchKey}`)) {
      flag(
        "failed",
        r.tenant,
        `run ${r.runId} (${
          r.dispatchKey ?? r.marker
        }) failed after ${r.attempts} attempts: ${r.error}`,
      );
    }
  }

  checkEvents(seen, flag);

  for (const a of seen.http) {
    const runs = byKey.get(`${a.tenant}/${a.dispatchKey}`) ?? [];
    if (a.runId === undefined) {
      flag("http", a.tenant, `key ${a.dispatchKey}: ${a.status ?? "no answer"} ${a.error ?? ""}`);
    } else if (runs.length > 0 && !runs.some((r) => r.runId === a.runId)) {
      flag(
        "http",
        a.tenant,
        `key ${a.dispatchKey}: told run ${a.runId}, the key's run is ${runs[0].runId}`,
      );
    }
  }

  for (const c of seen.crashes) flag("crashes", "", c);

  const limited = checkLimits(plan, seen, flag);
  const durable = checkDurable(plan, seen.durable, flag);
  const children = checkChildren(plan, seen.parents, flag);

  for (const [partition, n] of seen.uncommitted) {
    if (n > 0) {
      const tenant = partition.split(".")[1] ?? "";
      flag("lag", tenant, `${partition}: ${n} message(s) never committed by the relay group`, n);
    }
  }

  const unparked = seen.unpublished.filter((e) => !e.parked);
  for (const e of unparked) {
    flag("unparked", e.tenant, `run ${e.runId} seq ${e.seq} (${e.type}) never published`);
  }

  return {
    counts,
    examples,
    info: {
      parked: seen.unpublished.length - unparked.length,
      deadLetters: seen.deadLetters.length,
      runs: seen.runs.length,
      events: seen.events.length,
      limited,
      durable,
      children,
    },
  };
}

/** Counts a violation of `counter`, keeping a few examples. */
export type Flag = (counter: Counter, tenant: string, text: string) => void;

function checkPoison(
  m: PoisonMessage,
  dead: DeadLetterSeen[],
  byKey: Map<string, RunRow[]>,
  byMarker: Map<string, RunRow[]>,
  copies: Map<string, number>,
  flag: Flag,
) {
  if (m.kind === "oversized-result") return;
  const reasons = [...new Set(dead.map((d) => d.reason))];
  const what = `${m.kind} ${m.key}`;
  if (m.kind === "keyless") {
    // Exactly once: one run per copy on the topic (a producer retry may have
    // written it twice, at another offset, so under another derived key), and
    // never a dead letter.
    const runs = byMarker.get(`${m.tenant}/${m.marker}`) ?? [];
    const allowed = Math.max(1, copies.get(m.key) ?? 1);
    if (runs.length > allowed) {
      flag("dup", m.tenant, `${what}: ${runs.length} runs for ${allowed} message(s)`);
    }
    if (dead.length > 0) flag("dlq_extra", m.tenant, `${what}: dead-lettered (${reasons})`);
    if (runs.length === 0) flag("lost", m.tenant, `${what}: not admitted`);
    return;
  }
  const expected = EXPECTED_REASONS[m.kind];
  const rightReason = dead.some((d) => expected.includes(d.reason));
  if (dead.length === 0) flag("dlq_missing", m.tenant, `${what}: no dead letter`);
  else if (!rightReason) {
    flag("dlq_missing", m.tenant, `${what}: dead-lettered as ${reasons}, expected ${expected}`);
  }
  const runs = byKey.get(`${m.tenant}/${m.dispatchKey}`) ?? [];
  if (runs.length > 0) flag("dlq_extra", m.tenant, `${what}: admitted as run ${runs[0].runId}`);
}

function checkEvents(seen: Observed, flag: Flag) {
  const parked = new Set(
    seen.unpublished.filter((e) => e.parked).map((e) => `${e.runId}/${e.seq}`),
  );
  const byRun = group(seen.events, (e) => e.runId);
  const runs = new Map(seen.runs.map((r) => [r.runId, r]));
  for (const r of seen.runs) {
    const events = byRun.get(r.runId) ?? [];
    const have = new Map<number, string>();
    const firsts: number[] = [];
    for (const e of events) {
      if (!have.has(e.seq)) firsts.push(e.seq);
      have.set(e.seq, e.type);
    }
    const missing: number[] = [];
    for (let seq = 1; seq <= r.eventSeq; seq++) {
      if (!have.has(seq) && !parked.has(`${r.runId}/${seq}`)) missing.push(seq);
    }
    const label = `run ${r.runId} (${r.dispatchKey ?? r.marker}, ${r.status})`;
    const beyond = [...have.keys()].filter((s) => s > r.eventSeq || s < 1);
    if (missing.length > 0) {
      flag("gaps", r.tenant, `${label}: seq ${compact(missing)} of 1..${r.eventSeq} not on Kafka`);
    } else if (beyond.length > 0) {
      flag("gaps", r.tenant, `${label}: seq ${beyond} on Kafka, beyond its last ${r.eventSeq}`);
    } else if (!OPEN.has(r.status)) {
      const last = have.get(r.eventSeq);
      if (last !== undefined && !TERMINAL_EVENTS.has(last)) {
        flag("gaps", r.tenant, `${label}: last event ${r.eventSeq} is ${last}, not terminal`);
      }
    }
    if (firsts.some((seq, i) => i > 0 && seq < firsts[i - 1])) {
      flag("order", r.tenant, `${label}: events arrived as seq ${firsts.slice(0, 12)}`);
    }
  }
  for (const [runId, events] of byRun) {
    if (!runs.has(runId)) {
      flag("gaps", events[0].tenant, `events of run ${runId}, which is not in the database`);
    }
  }
}

function group<T>(items: Iterable<T>, key: (item: T) => string): Map<string, T[]> {
  const out = new Map<string, T[]>();
  for (const item of items) {
    const k = key(item);
    const list = out.get(k);
    if (list) list.push(item);
    else out.set(k, [item]);
  }
  return out;
}

/** `1,2,3,7` → `1-3,7`, for readable examples. */
function compact(seqs: number[]): string {
  const parts: string[] = [];
  for (let i = 0; i < seqs.length;) {
    let j = i;
    while (j + 1 < seqs.length && seqs[j + 1] === seqs[j] + 1) j++;
    parts.push(i === j ? `${seqs[i]}` : `${seqs[i]}-${seqs[j]}`);
    i = j + 1;
  }
  return parts.join(",");
}
