/**
 * One chaos run: set up the private cluster, publish the planned messages
 * while HTTP callers race, faults fly and the sampler watches the
 * concurrency groups, drain, read everything back, judge, report, tear
 * down. See dev/chaos.ts for the command.
 */
import { Cluster } from "./cluster.ts";
import { DURABLE, KEYED, PARENT, type Plan, plan, type PlannedMessage, prng } from "./plan.ts";
import { createStepCalls, selectDurableRuns } from "./step_calls.ts";
import { describeDurable } from "./verdict_durable.ts";
import { describeChildren } from "./verdict_children.ts";
import { selectParentRuns } from "./parent_runs.ts";
import {
  databaseBacklog,
  type DrainState,
  readTopics,
  relayLag,
  selectRuns,
  selectSlotGroups,
  selectUnpublished,
} from "./observe.ts";
import { type Sampled, startSampler } from "./sampler.ts";
import {
  COUNTERS,
  type DeadLetterSeen,
  type EventSeen,
  type HttpAnswer,
  verdict,
} from "./verdict.ts";
import { createProducer, type KafkaProducer } from "../../kafka/producer.ts";
import { dispatchTopic, dlqTopic, eventsTopic, tenantOfTopic } from "../../contracts/topics.ts";
import { DLQ_HEADERS } from "../../relay/dead_letter.ts";
import { EVENT_HEADERS, parseEventMessage } from "../../contracts/events.ts";
import { backoffWithJitter, delay, SECOND } from "../../core/time.ts";

export interface ChaosOptions {
  messages: number;
  faults: number;
  /** How long publishing (and the fault loop) lasts. */
  seconds: number;
  seed: number;
  pgRestart: boolean;
  keep: boolean;
  /** Longest the drain may take once publishing and faults ended. */
  drainSeconds: number;
  /** The drain gives up early when nothing moved for this long. */
  stallSeconds: number;
  databaseUrl: string;
}

/** The tenant that gets poison, and the one whose runs must not notice. */
export const TENANTS = { poisoned: "chaos-a", clean: "chaos-b" } as const;
/** The chaos API's body limit: small, so oversized poison stays under Kafka's message limit. */
const BODY_LIMIT = 256 * 1024;
/** HTTP callers racing each raced key. */
const CALLERS_PER_KEY = 2;
/** How often the sampler reads the concurrency groups. */
const SAMPLE_MS = 100;
/** What the workers host: the built-ins the workload uses, and the limited workflow. */
const WORKFLOWS_MODULE = new URL("./workflows.ts", import.meta.url).pathname;

type FaultKind = "api" | "relay" | "worker" | "outbox" | "broker" | "postgres";
const FAULT_KINDS: FaultKind[] = ["api", "relay", "worker", "outbox", "broker", "postgres"];
// One block of the schedule: processes far more often than the broker, whose
// restart takes a JVM start (10-20 s on a busy machine).
const FAULT_BLOCK: FaultKind[] = [
  ...Array<FaultKind>(4).fill("api"),
  ...Array<FaultKind>(4).fill("relay"),
  ...Array<FaultKind>(4).fill("worker"),
  ...Array<FaultKind>(3).fill("outbox"),
  ...Array<FaultKind>(4).fill("postgres"),
  "broker",
];

const began = Date.now();

function say(line: string) {
  console.log(`[chaos +${Math.round((Date.now() - began) / SECOND)}s] ${line}`);
}

/** Every kind once (shuffled), then shuffled blocks, `count` faults in all. */
function faultSchedule(count: number, random: () => number): FaultKind[] {
  const shuffled = <T>(items: T[]) =>
    items.map((v) => [random(), v] as const).sort((a, b) => a[0] - b[0]).map(([, v]) => v);
  const out = shuffled(FAULT_KINDS);
  while (out.length < count) out.push(...shuffled(FAULT_BLOCK));
  return out.slice(0, count);
}

/** Runs the chaos scenario; resolves with the exit code (0 clean, 1 violations, 2 harness failure). */
export async function runChaos(opts: ChaosOptions): Promise<number> {
  const dir = await Deno.makeTempDir({ prefix: "poimen-chaos-" });
  const cluster = new Cluster({
    dir,
    databaseUrl: opts.databaseUrl,
    tenants: [TENANTS.poisoned, TENANTS.clean],
    bodyLimit: BODY_LIMIT,
    pgRestart: opts.pgRestart,
    workflowsModule: WORKFLOWS_MODULE,
    workflows: ["echo", KEYED.workflow, DURABLE.workflow, PARENT.workflow],
    // Lower than the durable runs' sleeps: each suspends its run.
    workerEnv: { WORKER_SUSPEND_AFTER_MS: String(DURABLE.suspendAfterMs) },
    say,
  });
  let tornDown: Promise<void> | undefined;
  const tearDown = () =>
    tornDown ??= (opts.keep ? Promise.resolve() : cluster.tearDown()).catch((error) =>
      say(`tear-down failed: ${error instanceof Error ? error.message : error}`)
    );
  const onSignal = async () => {
    say("interrupted; tearing down");
    await tearDown();
    Deno.exit(130);
  };
  Deno.addSignalListener("SIGINT", onSignal);
  Deno.addSignalListener("SIGTERM", onSignal);

  let code = 2;
  try {
    say(
      `seed ${opts.seed}: ${opts.messages} messages and ${opts.faults} faults over ${opts.seconds} s; ` +
        `run directory ${dir}`,
    );
    await cluster.setUp();
    await createStepCalls(cluster.sql);
    const workload = plan({
      messages: opts.messages,
      tenants: TENANTS,
      seed: opts.seed,
      bodyLimit: BODY_LIMIT,
      stepCallsUrl: cluster.dbUrl,
    });
    const random = prng(opts.seed ^ 0x5eed);
    const callersDone = new AbortController();
    const answers: Promise<HttpAnswer>[] = [];
    const producer = createProducer({ brokers: cluster.brokers, clientId: "poimen-chaos" });
    const faults: Record<FaultKind, number> = {
      api: 0,
      relay: 0,
      worker: 0,
      outbox: 0,
      broker: 0,
      postgres: 0,
    };
    let pgKilled = 0;
    const sampler = startSampler(cluster.sql, SAMPLE_MS);
    let sampled: Sampled | undefined;
    try {
      await Promise.all([
        publish(workload, producer, opts.seconds * SECOND, (m) => {
          for (let c = 0; c < CALLERS_PER_KEY; c++) {
            answers.push(callApi(cluster, m, callersDone.signal));
          }
        }),
        (async () => {
          const schedule = faultSchedule(opts.faults, random);
          const every = (opts.seconds * SECOND) / Math.max(1, schedule.length);
          const t0 = Date.now();
          for (const [i, kind] of schedule.entries()) {
            // On a timetable: a slow fault (a broker restart) is made up for, not added up.
            await delay(Math.max(0, t0 + (i + 0.5 + (random() - 0.5) * 0.8) * every - Date.now()));
            pgKilled += await inject(cluster, kind, random);
            faults[kind]++;
          }
        })(),
      ]);
    } catch (error) {
      await sampler.stop();
      throw error;
    } finally {
      await producer.close().catch(() => {});
    }
    const total = Object.values(faults).reduce((a, b) => a + b, 0);
    say(
      `published ${workload.messages.length} messages; ${total} faults: ` +
        Object.entries(faults).map(([k, v]) => `${k}=${v}`).join(" ") +
        (opts.pgRestart
          ? " (postgres: cluster restarts)"
          : ` (postgres: connection kills, ${pgKilled} backends)`),
    );

    const drained = await drain(cluster, answers, opts).finally(async () => {
      sampled = await sampler.stop();
    });
    // Before the relays stop: a graceful stop commits what they finished.
    const uncommitted = await relayLag(
      cluster.brokers,
      cluster.relayGroup,
      Object.values(TENANTS).map(dispatchTopic),
    ).catch(() => new Map<string, number>());
    callersDone.abort();
    const http = await Promise.all(answers);
    const unclean = await cluster.stopProcesses();

    const seen = await observe(cluster, workload);
    const crashes = cluster.crashes();
    const slots = { ...sampled!, final: seen.finalSlots };
    const result = verdict(
      workload,
      { ...seen, http, crashes, uncommitted, slots },
      TENANTS.clean,
    );
    if (!drained) say(`not drained within the deadline (see stuck, unparked, dlq_missing below)`);
    for (const u of unclean) say(`unclean stop: ${u}`);
    for (const counter of COUNTERS) {
      if (result.counts[counter] === 0) continue;
      say(`${counter} = ${result.counts[counter]}, e.g.:`);
      for (const e of result.examples[counter]) console.log(`    ${e}`);
    }
    const violations = COUNTERS.reduce((n, c) => n + result.counts[c], 0);
    code = violations === 0 ? 0 : 1;
    const keys = [...workload.keys.values()].reduce((n, k) => n + k.size, 0);
    say(
      `${result.info.runs} runs, ${result.info.events} events read back, ` +
        `${result.info.deadLetters} dead letters, ${result.info.parked} parked events; ` +
        `${code === 0 ? "" : `logs kept in ${dir}/logs; `}` +
        `${Math.round((Date.now() - began) / SECOND)} s`,
    );
    const l = result.info.limited;
    const keyed = workload.messages.filter((m) => m.kind === "fresh" && m.group).length;
    say(
      `${workload.limited.workflow} (limit ${workload.limited.limit} per group): ${keyed} runs ` +
        `over ${l.groups} groups; ${l.samples} samples every ${SAMPLE_MS} ms ` +
        `(${l.failedSamples} failed): at most ${l.maxRunning} running in a group, ` +
        `${l.contended} samples with a group at its limit and runs waiting`,
    );
    say(describeDurable(workload.durable.workflow, result.info.durable));
    say(describeChildren(workload.parents.workflow, result.info.children));
    console.log(
      `chaos: ${workload.messages.length} msgs, ${keys} keys, ${total} faults | ` +
        COUNTERS.map((c) => `${c}=${result.counts[c]}`).join(" ") +
        ` | seed ${opts.seed}`,
    );
  } catch (error) {
    console.log(`[chaos] logs in ${dir}/logs`);
    console.log(`chaos: harness failed: ${error instanceof Error ? error.stack : error}`);
    code = 2;
  } finally {
    await tearDown();
    Deno.removeSignalListener("SIGINT", onSignal);
    Deno.removeSignalListener("SIGTERM", onSignal);
    if (code === 0 && !opts.keep) await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
  return code;
}

/** Publishes the plan evenly over `windowMs`; `race` is called for each raced message. */
async function publish(
  workload: Plan,
  producer: KafkaProducer,
  windowMs: number,
  race: (m: PlannedMessage) => void,
): Promise<void> {
  const t0 = Date.now();
  const all = workload.messages;
  let sent = 0;
  while (sent < all.length) {
    const due = Math.min(all.length, Math.ceil(((Date.now() - t0) / windowMs) * all.length));
    if (due > sent) {
      const batch = all.slice(sent, due);
      for (const m of batch) if (m.race && m.kind === "fresh") race(m);
      // Without a retry limit: a send waits out a broker crash.
      await producer.send(
        batch.map((m) => ({ topic: dispatchTopic(m.tenant), key: m.key, value: m.value })),
      );
      sent = due;
    }
    await delay(100);
  }
}

/** One HTTP caller: posts the body until it gets a run (or a refusal), retrying outages. */
async function callApi(
  cluster: Cluster,
  m: PlannedMessage,
  stop: AbortSignal,
): Promise<HttpAnswer> {
  const answer: HttpAnswer = { tenant: m.tenant, dispatchKey: m.dispatchKey! };
  for (let attempt = 0; !stop.aborted; attempt++) {
    try {
      const res = await fetch(`${cluster.apiUrl}/v1/runs`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${cluster.tenantTokens.get(m.tenant)}`,
          "content-type": "application/json",
        },
        body: m.value,
        signal: AbortSignal.any([stop, AbortSignal.timeout(15 * SECOND)]),
      });
      const text = await res.text();
      answer.status = res.status;
      if (res.status === 200 || res.status === 201) {
        answer.runId = JSON.parse(text).run_id;
        answer.error = undefined;
        return answer;
      }
      answer.error = text.slice(0, 200);
      // Outages are the callers' to wait out; a refusal of a valid body is an answer.
      if (res.status < 500 && res.status !== 408 && res.status !== 429) return answer;
    } catch (error) {
      answer.error = error instanceof Error ? error.message : String(error);
    }
    await delay(Math.max(50, backoffWithJitter(attempt, 100, 2 * SECOND)), stop);
  }
  answer.error = `no run before the drain ended (last: ${answer.status ?? ""} ${
    answer.error ?? ""
  })`;
  return answer;
}

/** One fault; resolves once it is injected and the victim restarting. Returns Postgres backends killed. */
async function inject(cluster: Cluster, kind: FaultKind, random: () => number): Promise<number> {
  const pick = <T>(items: T[]) => items[Math.floor(random() * items.length)];
  switch (kind) {
    case "api":
    case "relay":
    case "worker":
    case "outbox":
      await cluster.killProcess(pick(cluster.slots(kind)), Math.floor(random() * SECOND));
      return 0;
    case "broker": {
      const t = Date.now();
      await cluster.crashBroker(Math.floor(random() * 2 * SECOND));
      say(`broker crashed and back after ${((Date.now() - t) / SECOND).toFixed(1)} s`);
      return 0;
    }
    case "postgres":
      return await cluster.postgresFault(500 + Math.floor(random() * 2 * SECOND));
  }
}

/**
 * Polls until the relay group committed everything, no run is open, no
 * event waits, and every HTTP caller has its answer; gives up at the
 * deadline, or when nothing moved for `stallSeconds`. True when drained.
 */
async function drain(
  cluster: Cluster,
  answers: Promise<HttpAnswer>[],
  opts: ChaosOptions,
): Promise<boolean> {
  let pending = answers.length;
  for (const a of answers) void a.finally(() => pending--);
  const topics = Object.values(TENANTS).map(dispatchTopic);
  const start = Date.now();
  const deadline = start + opts.drainSeconds * SECOND;
  let last = "";
  let lagByPartition = new Map<string, number>();
  let lastChange = Date.now();
  let lastReport = 0;
  const giveUp = async (why: string) => {
    say(`${why}: ${last}`);
    say(
      `  relay group lag by partition: ${
        [...lagByPartition].map(([k, v]) => `${k}=${v}`).join(" ")
      }`,
    );
    for (const line of await cluster.relayHealth()) say(`  ${line}`);
    return false;
  };
  while (true) {
    let state: DrainState & { callers: number } | undefined;
    try {
      lagByPartition = await relayLag(cluster.brokers, cluster.relayGroup, topics);
      const lag = [...lagByPartition.values()].reduce((a, b) => a + b, 0);
      state = { lag, ...(await databaseBacklog(cluster.sql)), callers: pending };
    } catch (error) {
      say(`drain: probe failed (${error instanceof Error ? error.message : error})`);
    }
    const now = Date.now();
    if (state) {
      const line = `lag=${state.lag} open_runs=${state.open} unpublished=${state.unpublished} ` +
        `callers=${state.callers}`;
      if (
        state.lag + state.open + state.unpublished + state.callers === 0 && cluster.allRunning()
      ) {
        say(`drained in ${Math.round((now - start) / SECOND)} s`);
        return true;
      }
      if (line !== last) {
        last = line;
        lastChange = now;
      }
      if (now - lastReport >= 10 * SECOND) {
        say(`draining: ${line}`);
        lastReport = now;
      }
    }
    if (now > deadline) return await giveUp(`drain deadline (${opts.drainSeconds} s) passed`);
    if (now - lastChange > opts.stallSeconds * SECOND) {
      return await giveUp(`nothing moved for ${opts.stallSeconds} s, giving up the drain`);
    }
    await delay(500);
  }
}

/** Reads back the topics and the database. */
async function observe(cluster: Cluster, workload: Plan) {
  const tenants = Object.values(TENANTS);
  const dispatch = await readTopics(cluster.brokers, tenants.map(dispatchTopic));
  const dispatchCopies = new Map<string, number>();
  for (const m of dispatch) dispatchCopies.set(m.key, (dispatchCopies.get(m.key) ?? 0) + 1);
  const planned = workload.messages.length;
  if (dispatch.length < planned) {
    throw new Error(`only ${dispatch.length} of ${planned} published messages read back`);
  }

  const deadLetters: DeadLetterSeen[] = (await readTopics(cluster.brokers, tenants.map(dlqTopic)))
    .map((m) => ({
      tenant: tenantOfTopic(m.topic)!,
      key: m.key,
      reason: m.headers[DLQ_HEADERS.reason] ?? "(no reason header)",
    }));

  const events: EventSeen[] = (await readTopics(cluster.brokers, tenants.map(eventsTopic))).map(
    (m) => {
      const tenant = tenantOfTopic(m.topic)!;
      try {
        const e = parseEventMessage(m.value);
        return { tenant, runId: e.run_id, seq: e.seq, type: e.type };
      } catch {
        // Not the contract: the headers still say which run and seq (a gap otherwise).
        return {
          tenant,
          runId: m.headers[EVENT_HEADERS.runId] ?? "(no run id)",
          seq: Number(m.headers[EVENT_HEADERS.seq]),
          type: `(malformed) ${m.headers[EVENT_HEADERS.type]}`,
        };
      }
    },
  );
  const runs = await retrying(() => selectRuns(cluster.sql));
  const unpublished = await retrying(() => selectUnpublished(cluster.sql));
  const finalSlots = await retrying(() => selectSlotGroups(cluster.sql));
  const durable = await retrying(() => selectDurableRuns(cluster.sql, DURABLE.workflow));
  const parents = await retrying(() => selectParentRuns(cluster.sql, PARENT.workflow));
  return { runs, events, deadLetters, dispatchCopies, unpublished, finalSlots, durable, parents };
}

/** A read of the database, retried through what is left of a connection kill. */
async function retrying<T>(read: () => Promise<T>): Promise<T> {
  for (let attempt = 0;; attempt++) {
    try {
      return await read();
    } catch (error) {
      if (attempt >= 5) throw error;
      await delay(500);
    }
  }
}
