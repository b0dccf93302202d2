/**
 * `deno task dlq <tenant> [--redrive]`: lists a tenant's dead letters
 * (`poimen.<tenant>.dispatch.dlq`), one line each, read from the start with a
 * throwaway consumer that commits nothing. With `--redrive`, publishes each
 * back to `poimen.<tenant>.dispatch` (a signal's to `poimen.<tenant>.signals`;
 * same key, value and original headers,
 * without the `poimen-dlq-*` ones) and says, for each, whether a run was
 * created or already existed, asking the API by `dispatch_key` (needs a token
 * in POIMEN_TOKEN or RELAY_TOKEN; without one it can only say "republished").
 *
 * Dead letters stay in the DLQ topic (Kafka deletes by retention only), so a
 * second redrive republishes them again; with a `dispatch_key` that is
 * harmless, the admission index makes one run.
 */
import { z } from "zod";
import { kafkaEnv, logEnv, processEnv, readEnv } from "../core/config.ts";
import { kafkaConnection } from "../kafka/security.ts";
import { createLogger } from "../core/log.ts";
import { delay, SECOND } from "../core/time.ts";
import { PoimenClient } from "../client/http.ts";
import { DLQ_HEADERS, redriven } from "../relay/dead_letter.ts";
import { type ConsumedMessage, createConsumer } from "../kafka/consumer.ts";
import { createAdmin } from "../kafka/admin.ts";
import type { KafkaClientOptions } from "../kafka/client.ts";
import { createProducer } from "../kafka/producer.ts";
import { dlqTopic, isTenantId, signalsTopic } from "../contracts/topics.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";

const DlqEnv = z.object({
  ...kafkaEnv,
  ...logEnv,
  API_URL: z.string().url().default("http://127.0.0.1:8080"),
  POIMEN_TOKEN: z.string().min(1).optional(),
  RELAY_TOKEN: z.string().min(1).optional(),
  /** How long a redrive waits for each republished message's run to appear. */
  DLQ_REDRIVE_WAIT_MS: z.coerce.number().int().nonnegative().default(15 * SECOND),
  /** How long reading the DLQ may take before giving up. */
  DLQ_READ_TIMEOUT_MS: z.coerce.number().int().positive().default(60 * SECOND),
});

const COMMAND = {
  name: "dlq",
  synopsis: "[--redrive] <tenant>",
  description: `
Lists a tenant's dead letters (poimen.<tenant>.dispatch.dlq), one line each.
With --redrive, publishes each back to poimen.<tenant>.dispatch and says
whether a run was created or already existed (asking the API, with the token
in POIMEN_TOKEN or RELAY_TOKEN).`,
  flags: {
    redrive: { type: "boolean", description: "republish the dead letters to the dispatch topic" },
  },
  positionals: { min: 1, max: 1 },
  env: DlqEnv,
} satisfies CommandSpec;

const decoder = new TextDecoder();

export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const redrive = line.flags.redrive ?? false;
  const [tenant] = line.positionals;
  if (!isTenantId(tenant)) {
    return usageError(COMMAND, `bad tenant id ${JSON.stringify(tenant)}`);
  }
  const config = readEnv(DlqEnv, processEnv());
  const log = createLogger("dlq", config.LOG_LEVEL);
  const kafka = {
    ...kafkaConnection(config),
    clientId: `${config.KAFKA_CLIENT_ID}-dlq`,
    logger: log,
  };

  const letters = await readAll(kafka, dlqTopic(tenant), config.DLQ_READ_TIMEOUT_MS);
  for (const m of letters) console.log(describe(m));
  if (!redrive) {
    console.log(`${letters.length} dead letter(s) in ${dlqTopic(tenant)}`);
    return 0;
  }
  if (letters.length === 0) {
    console.log("nothing to redrive");
    return 0;
  }

  const token = config.POIMEN_TOKEN ?? config.RELAY_TOKEN;
  const api = token === undefined ? undefined : new RunLookup(config.API_URL, token, tenant);
  const keys = letters.map(dispatchKeyOf);
  const before = await Promise.all(
    keys.map((k) => k && api ? api.find(k).catch(() => null) : undefined),
  );

  const republished = letters.map((m) => redriven(tenant, m));
  const producer = createProducer({ ...kafka, retries: 10 });
  try {
    await producer.send(republished);
  } finally {
    await producer.close();
  }

  // Wait for all republished messages at once, with one deadline.
  const deadline = Date.now() + config.DLQ_REDRIVE_WAIT_MS;
  const results = await Promise.all(letters.map(async (m, i) => {
    const key = keys[i];
    const at = position(m);
    // A signal has no run to look up: the relay dead-letters it again if it still cannot be sent.
    if (republished[i].topic === signalsTopic(tenant)) return `${at}: republished as a signal`;
    if (key === undefined) return `${at}: republished (no dispatch_key: cannot tell its run)`;
    if (!api) return `${at}: republished (no POIMEN_TOKEN/RELAY_TOKEN: not checked)`;
    const had = before[i];
    // null: the API could not be asked.
    if (had === null) {
      return `${at}: republished; the API did not answer, run for ${key} unknown`;
    }
    if (had) return `${at}: republished; run ${had} already existed for ${key}`;
    while (true) {
      const runId = await api.find(key).catch(() => undefined);
      if (runId) return `${at}: republished; run ${runId} created for ${key}`;
      if (Date.now() > deadline) {
        return `${at}: republished; no run for ${key} yet (it may be dead-lettered again)`;
      }
      await delay(250);
    }
  }));
  for (const line of results) console.log(line);
  const signals = republished.filter((m) => m.topic === signalsTopic(tenant)).length;
  console.log(
    `${letters.length - signals} dead letter(s) republished to poimen.${tenant}.dispatch` +
      (signals > 0 ? `, ${signals} to poimen.${tenant}.signals` : ""),
  );
  return 0;
}

/** Reads `topic` from the start up to its end offsets (as they were when asked). */
async function readAll(
  kafka: KafkaClientOptions & { logger: ReturnType<typeof createLogger> },
  topic: string,
  timeoutMs: number,
): Promise<ConsumedMessage[]> {
  const admin = createAdmin(kafka);
  let ends: Map<number, bigint>;
  try {
    ends = new Map((await admin.endOffsets([topic])).map((o) => [o.partition, o.offset]));
  } finally {
    await admin.close();
  }
  const waiting = new Map([...ends].filter(([, end]) => end > 0n));
  if (waiting.size === 0) return [];
  // A group of its own that never commits: reading leaves no trace for anyone else.
  const consumer = createConsumer({
    ...kafka,
    groupId: `poimen-dlq-cli-${crypto.randomUUID()}`,
    topics: [topic],
    startFrom: "earliest",
  });
  const got: ConsumedMessage[] = [];
  const timer = setTimeout(() => void consumer.close(), timeoutMs);
  try {
    for await (const m of consumer) {
      const end = waiting.get(m.partition);
      if (end === undefined || m.offset >= end) continue;
      got.push(m);
      if (m.offset + 1n >= end) waiting.delete(m.partition);
      if (waiting.size === 0) break;
    }
  } finally {
    clearTimeout(timer);
    await consumer.close();
  }
  // Messages deleted by retention leave a partition short of its end: then
  // the reader ends only by the timeout, and what it read is still right.
  if (waiting.size > 0) {
    if (got.length === 0) throw new Error(`could not read ${topic} within ${timeoutMs} ms`);
    kafka.logger.warn("stopped reading before the end offsets", { topic, read: got.length });
  }
  return got.sort((a, b) => a.partition - b.partition || Number(a.offset - b.offset));
}

function position(m: ConsumedMessage): string {
  return `${m.partition}/${m.offset}`;
}

function describe(m: ConsumedMessage): string {
  const h = m.headers;
  const from = `${h[DLQ_HEADERS.topic] ?? "?"}/${h[DLQ_HEADERS.partition] ?? "?"}/${
    h[DLQ_HEADERS.offset] ?? "?"
  }`;
  return [
    position(m),
    `reason=${h[DLQ_HEADERS.reason] ?? "?"}`,
    `status=${h[DLQ_HEADERS.status] ?? "?"}`,
    `from=${from}`,
    `attempts=${h[DLQ_HEADERS.attempts] ?? "?"}`,
    `key=${JSON.stringify(m.key)}`,
    `value=${preview(m.value)}`,
    `detail=${JSON.stringify(h[DLQ_HEADERS.detail] ?? "")}`,
  ].join(" ");
}

function preview(value: Uint8Array): string {
  const text = decoder.decode(value.subarray(0, 200));
  return JSON.stringify(text.length > 80 ? text.slice(0, 79) + "…" : text);
}

function dispatchKeyOf(m: ConsumedMessage): string | undefined {
  try {
    const key = JSON.parse(decoder.decode(m.value))?.dispatch_key;
    return typeof key === "string" && key.length > 0 ? key : undefined;
  } catch {
    return undefined;
  }
}

/** Finds a tenant's run by dispatch key through the API (never the database). */
class RunLookup {
  readonly #client: PoimenClient;

  constructor(apiUrl: string, token: string, tenant: string) {
    // Either token works: Poimen-Tenant names the tenant a service token acts
    // for, and a tenant token of this tenant is let through with it.
    this.#client = new PoimenClient({ url: apiUrl, token, tenant, retry: { maxAttempts: 3 } });
  }

  async find(dispatchKey: string): Promise<string | undefined> {
    for await (const page of this.#client.listRuns({ dispatch_key: dispatchKey, limit: 1 })) {
      return page.runs[0]?.run_id;
    }
    return undefined;
  }
}
