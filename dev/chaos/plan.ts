/**
 * The chaos workload, decided up front from a seed: which dispatch messages
 * are published, in which order, which are redeliveries (the same bytes
 * published again), which are poison, which are runs of the limited
 * workflow (and of which concurrency group), and which keys HTTP callers
 * race for. Pure: no I/O, so a seed reproduces the same messages.
 */

/** What a poison message is, and so what must become of it. */
export type PoisonKind =
  /** Not JSON: dead-lettered `bad-json`. */
  | "bad-json"
  /** A workflow no registry knows: dead-lettered `unknown-workflow`. */
  | "unknown-workflow"
  /** A NUL character in the input, which Postgres' jsonb cannot hold: dead-lettered `validation`. */
  | "nul-input"
  /** A body over the API's body limit: dead-lettered `body-too-large`. */
  | "oversized-body"
  /**
   * A body under the limit whose run's result (echo returns its input) is
   * several times larger once stored, larger than a Kafka message may be:
   * admitted once, and its run must still end and its events not block others.
   */
  | "oversized-result"
  /** No dispatch_key: admitted exactly once under the key the relay derives, never dead-lettered. */
  | "keyless";

const POISON_KINDS: readonly PoisonKind[] = [
  "bad-json",
  "unknown-workflow",
  "nul-input",
  "oversized-body",
  "oversized-result",
  "keyless",
];

/** One message to publish on a tenant's dispatch topic. */
export interface PlannedMessage {
  tenant: string;
  /** The Kafka key: unique per intended run (`<tenant>/<dispatch_key or marker>`). */
  key: string;
  value: string;
  kind: "fresh" | "redelivery" | PoisonKind;
  /** The run's dispatch_key, when the body has one. */
  dispatchKey?: string;
  /** Keyless messages: the unique marker in their input (`input.chaos_keyless`). */
  marker?: string;
  /** HTTP callers post the same body over `POST /v1/runs` while it is published. */
  race: boolean;
  /** Runs of the limited workflow (KEYED): the concurrency group its input names. */
  group?: string;
  /** Runs of the durable workflow (DURABLE): how long its sleep lasts. */
  sleepMs?: number;
  /** Runs of the parent workflow (PARENT): how many children its map starts. */
  children?: number;
}

/** A poison message: one of the planned messages, of a poison kind. */
export type PoisonMessage = PlannedMessage & { kind: PoisonKind };

export interface PlanOptions {
  /** Dispatch messages over all tenants. */
  messages: number;
  /** The tenant that gets the poison, and the one that must stay unaffected. */
  tenants: { poisoned: string; clean: string };
  seed: number;
  /** The API's body limit: oversized bodies are made larger, oversized results just under. */
  bodyLimit: number;
  /**
   * Where durable runs record their step calls (the chaos database's URL),
   * in their input: handlers get no environment to find it in.
   */
  stepCallsUrl?: string;
}

export interface Plan {
  /** In publishing order. */
  messages: PlannedMessage[];
  /** Keys that must each end as exactly one run, per tenant (fresh and oversized-result). */
  keys: Map<string, Set<string>>;
  /** The poison messages, one entry each (none is republished). */
  poison: PoisonMessage[];
  /** The limited workflow and its limit per concurrency group, as its definition declares. */
  limited: { workflow: string; limit: number };
  /** The durable workflow (DURABLE) and its steps, in call order. */
  durable: { workflow: string; steps: readonly string[]; sleep: string };
  /** The parent workflow (PARENT). */
  parents: { workflow: string };
}

/**
 * Share of messages on the clean tenant, of redeliveries, of poison, of raced
 * keys, and of fresh keys that are runs of the limited workflow (KEYED).
 */
const SHARES = {
  clean: 0.2,
  redeliveries: 0.2,
  poison: 0.01,
  race: 0.1,
  keyed: 0.25,
  durable: 0.15,
  parent: 0.06,
} as const;

/**
 * The limited workflow of the workload (dev/chaos/workflows.ts defines it):
 * at most `limit` running per tenant and value of `input.group`, one of
 * `groups` values, so that each group is contended; each run takes `minMs`
 * to `maxMs` (its `input.ms`), so that runs of a group overlap and a killed
 * worker's runs hold their slots until their leases are reclaimed.
 */
export const KEYED = {
  workflow: "chaos.keyed",
  limit: 2,
  pointer: "/group",
  groups: 8,
  minMs: 300,
  maxMs: 3000,
} as const;

/**
 * The durable workflow of the workload (dev/chaos/workflows.ts defines it):
 * a step, a sleep of `minSleepMs` to `maxSleepMs` (longer than the workers'
 * WORKER_SUSPEND_AFTER_MS, `suspendAfterMs`, so that it suspends the run),
 * then two more steps. Each step's function records one call through its
 * own connection (dev/chaos/step_calls.ts), so that a step run again after
 * its result was stored shows up as a second call.
 */
export const DURABLE = {
  workflow: "chaos.durable",
  steps: ["charge", "ship", "notify"],
  sleep: "cool-off",
  suspendAfterMs: 300,
  minSleepMs: 1000,
  maxSleepMs: 4000,
} as const;

/**
 * The parent workflow of the workload (dev/chaos/workflows.ts defines it): a
 * map of `minChildren` to `maxChildren` children of echo (`ctx.map`, name
 * `map`), then one more child (`ctx.start`, name `solo`) whose `result()` it
 * waits for; each wait suspends the parent (no slot held) until its
 * children's finishing statements wake it. Its result lists every child's
 * `j` in order, so a result not built from its children shows.
 */
export const PARENT = {
  workflow: "chaos.parent",
  map: "parts",
  solo: "solo",
  minChildren: 2,
  maxChildren: 8,
} as const;

/** mulberry32: a small, fast, seedable PRNG (the workload, not security). */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function shuffle<T>(items: T[], random: () => number): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [items[i], items[j]] = [items[j], items[i]];
  }
  return items;
}

const body = (value: Record<string, unknown>) => JSON.stringify(value);

function poisonMessage(
  tenant: string,
  kind: PoisonKind,
  n: number,
  bodyLimit: number,
): PoisonMessage {
  const dispatchKey = `poison-${kind}-${n}`;
  const keyed = (value: string): PoisonMessage => ({
    tenant,
    key: `${tenant}/${dispatchKey}`,
    value,
    kind,
    dispatchKey,
    race: false,
  });
  switch (kind) {
    case "bad-json":
      return keyed(`{"workflow_ref":"echo","dispatch_key":"${dispatchKey}","input":{"n":${n}`);
    case "unknown-workflow":
      return keyed(
        body({ workflow_ref: "chaos-no-such-workflow", input: { n }, dispatch_key: dispatchKey }),
      );
    case "nul-input": {
      // JSON.stringify writes U+0000 as the escape \u0000: valid JSON, invalid jsonb.
      const inputs = ["\u0000", { text: `a\u0000b` }, [n, "\u0000"]];
      return keyed(
        body({ workflow_ref: "echo", input: inputs[n % inputs.length], dispatch_key: dispatchKey }),
      );
    }
    case "oversized-body":
      return keyed(body({
        workflow_ref: "echo",
        input: { blob: "x".repeat(bodyLimit + 16 * 1024) },
        dispatch_key: dispatchKey,
      }));
    case "oversized-result": {
      // `1e20,` is 5 bytes in the body and 22 in the result (100000000000000000000):
      // a body just under the limit makes a result over a megabyte.
      const count = Math.floor((bodyLimit - 200) / 5);
      const value = `{"workflow_ref":"echo","dispatch_key":"${dispatchKey}","input":[${
        Array(count).fill("1e20").join(",")
      }]}`;
      return keyed(value);
    }
    case "keyless": {
      const marker = `keyless-${n}`;
      return {
        tenant,
        key: `${tenant}/${marker}`,
        value: body({ workflow_ref: "echo", input: { chaos_keyless: marker } }),
        kind,
        marker,
        race: false,
      };
    }
  }
}

function tenantMessages(
  tenant: string,
  count: number,
  poisonCount: number,
  opts: PlanOptions,
  random: () => number,
  keys: Set<string>,
  poison: PoisonMessage[],
): PlannedMessage[] {
  const redeliveries = Math.round(count * SHARES.redeliveries);
  const fresh = Math.max(1, count - redeliveries - poisonCount);
  const list: PlannedMessage[] = [];
  for (let i = 0; i < fresh; i++) {
    const dispatchKey = `chaos-${i}`;
    keys.add(dispatchKey);
    const race = random() < SHARES.race;
    if (random() < SHARES.keyed) {
      const group = `g${Math.floor(random() * KEYED.groups)}`;
      const ms = KEYED.minMs + Math.floor(random() * (KEYED.maxMs - KEYED.minMs));
      list.push({
        tenant,
        key: `${tenant}/${dispatchKey}`,
        value: body({
          workflow_ref: KEYED.workflow,
          input: { i, key: dispatchKey, group, ms },
          dispatch_key: dispatchKey,
        }),
        kind: "fresh",
        dispatchKey,
        race,
        group,
      });
      continue;
    }
    if (random() < SHARES.parent) {
      const children = PARENT.minChildren +
        Math.floor(random() * (PARENT.maxChildren - PARENT.minChildren + 1));
      list.push({
        tenant,
        key: `${tenant}/${dispatchKey}`,
        value: body({
          workflow_ref: PARENT.workflow,
          input: { i, key: dispatchKey, children },
          dispatch_key: dispatchKey,
        }),
        kind: "fresh",
        dispatchKey,
        race,
        children,
      });
      continue;
    }
    if (random() < SHARES.durable) {
      const sleepMs = DURABLE.minSleepMs +
        Math.floor(random() * (DURABLE.maxSleepMs - DURABLE.minSleepMs));
      list.push({
        tenant,
        key: `${tenant}/${dispatchKey}`,
        value: body({
          workflow_ref: DURABLE.workflow,
          input: { i, key: dispatchKey, sleep_ms: sleepMs, calls_url: opts.stepCallsUrl ?? "" },
          dispatch_key: dispatchKey,
        }),
        kind: "fresh",
        dispatchKey,
        race,
        sleepMs,
      });
      continue;
    }
    list.push({
      tenant,
      key: `${tenant}/${dispatchKey}`,
      value: body({
        workflow_ref: "echo",
        input: { i, key: dispatchKey },
        dispatch_key: dispatchKey,
      }),
      kind: "fresh",
      dispatchKey,
      race,
    });
  }
  for (let i = 0; i < poisonCount; i++) {
    const kind = POISON_KINDS[i % POISON_KINDS.length];
    const m = poisonMessage(tenant, kind, i, opts.bodyLimit);
    if (kind === "oversized-result") keys.add(m.dispatchKey!);
    poison.push(m);
    list.push(m);
  }
  shuffle(list, random);
  // A redelivery comes after its original, anywhere later: at once, or long
  // after its run finished.
  const originals = list.filter((m) => m.kind === "fresh");
  for (let r = 0; r < redeliveries; r++) {
    const original = originals[Math.floor(random() * originals.length)];
    const at = list.indexOf(original);
    const to = at + 1 + Math.floor(random() * (list.length - at));
    list.splice(to, 0, { ...original, kind: "redelivery", race: false });
  }
  return list;
}

/**
 * The messages of a run: `messages` in all, a fifth on the clean tenant;
 * about 20 % redeliveries on each; about 1 % poison (at least one of each
 * kind) on the poisoned tenant; about 10 % of fresh keys raced over HTTP;
 * about 25 % of fresh keys runs of the limited workflow (KEYED), over its
 * groups on each tenant; about 4 % (6 % of the rest) runs of the parent
 * workflow (PARENT), each with its children; about 11 % (15 % of the rest)
 * runs of the durable workflow (DURABLE).
 */
export function plan(opts: PlanOptions): Plan {
  const random = prng(opts.seed);
  const { poisoned, clean } = opts.tenants;
  const cleanCount = Math.round(opts.messages * SHARES.clean);
  const poisonCount = Math.max(
    POISON_KINDS.length,
    Math.round(opts.messages * SHARES.poison),
  );
  const keys = new Map([[poisoned, new Set<string>()], [clean, new Set<string>()]]);
  const poison: PoisonMessage[] = [];
  const a = tenantMessages(
    poisoned,
    opts.messages - cleanCount,
    poisonCount,
    opts,
    random,
    keys.get(poisoned)!,
    poison,
  );
  const b = tenantMessages(clean, cleanCount, 0, opts, random, keys.get(clean)!, poison);
  // Interleave the tenants, each keeping its own order.
  const messages: PlannedMessage[] = [];
  let i = 0, j = 0;
  while (i < a.length || j < b.length) {
    const left = a.length - i, right = b.length - j;
    if (random() * (left + right) < left) messages.push(a[i++]);
    else messages.push(b[j++]);
  }
  return {
    messages,
    keys,
    poison,
    limited: { workflow: KEYED.workflow, limit: KEYED.limit },
    durable: { workflow: DURABLE.workflow, steps: DURABLE.steps, sleep: DURABLE.sleep },
    parents: { workflow: PARENT.workflow },
  };
}
