/** What the Kafka-facing tests share: the broker, a private broker, sanitizer settings, a collecting consumer. */
import {
  brokerAddress,
  brokerOptionsFromEnv,
  brokerRunning,
  startBroker,
  stopBroker,
} from "../../dev/kafka.ts";
import { type ConsumedMessage, createConsumer, type KafkaConsumer } from "../../kafka/consumer.ts";
import type { KafkaSecurity } from "../../kafka/security.ts";
import {
  ensureSecuredMaterial,
  securedClientSecurity,
  type SecuredMaterial,
} from "../../dev/kafka_secured.ts";
import { freePort } from "./processes.ts";

/**
 * The development broker the tests share (`deno task kafka start`; CI starts
 * it). No test stops it: one that needs an outage takes a `privateBroker()`.
 */
export const BROKER = brokerAddress();

/**
 * Options of a test that uses the Kafka client: Deno 2 runs tests without
 * its op and resource sanitizers unless asked, and these ask. They catch a
 * timer or a Deno resource left behind after close() (a 5 s close timeout
 * once outlived every consumer). They cannot see the client's sockets:
 * node:net sockets under Deno's Node compatibility are not in the resource
 * table, so a producer left open still passes; that is why every test closes
 * its clients in `finally`.
 */
export const KAFKA_TEST = { sanitizeOps: true, sanitizeResources: true };

/** A broker of one test's own, which it may stop and start at will. */
export interface PrivateBroker {
  /** Its bootstrap address, `127.0.0.1:<port>`; the same across stop/start. */
  readonly address: string;
  /** Starts it again (its data kept); resolves once it answers clients. */
  start(): Promise<void>;
  /** Stops it and waits for the exit; resolves false when it was not running. */
  stop(): Promise<boolean>;
  /** Whether its process is alive. */
  running(): Promise<boolean>;
  /** Stops it and removes its data; safe to call twice. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** A `PrivateBroker` in the secured mode (dev/kafka_secured.ts). */
export interface SecuredBroker extends PrivateBroker {
  /** Its mTLS listener, `127.0.0.1:<port>` (`address` is SASL_SSL). */
  readonly sslAddress: string;
  /** Its TLS material and SCRAM password. */
  readonly material: SecuredMaterial;
  /** How a client of `address` connects (SCRAM-SHA-512, the CA's PEM). */
  readonly security: KafkaSecurity;
}

/**
 * Starts a broker on free ports with a data directory of its own (the jars
 * are shared with the development broker's), for a test that takes the
 * broker down: stopping the shared one would break whatever else uses it,
 * and a broker started elsewhere on 9092 (another checkout, `deno task up`)
 * is not this test's to stop. Use with `await using`.
 */
export function privateBroker(): Promise<PrivateBroker>;
/** The same in the secured mode: SASL_SSL on `address`, mTLS on `sslAddress`. */
export function privateBroker(mode: { secured: true }): Promise<SecuredBroker>;
export async function privateBroker(
  mode: { secured?: boolean } = {},
): Promise<PrivateBroker | SecuredBroker> {
  const dir = await Deno.makeTempDir({ prefix: "poimen-test-kafka-" });
  const sslPort = freePort();
  const opts = {
    port: freePort(),
    controllerPort: freePort(),
    ...mode.secured ? { secured: { sslPort } } : {},
    dir,
    libs: brokerOptionsFromEnv().libs,
    heap: "384m",
  };
  let disposed = false;
  // The JVM of the latest start, reaped: awaited after each stop so its
  // process and exit-status wait are gone before the test ends.
  let reaped: (() => Promise<void>) | undefined;
  const broker: PrivateBroker = {
    address: brokerAddress(opts),
    async start() {
      const started = await startBroker(opts);
      // Something else answering on our port would make every outage a lie.
      if (started.pid === undefined) throw new Error(`${broker.address} is not this test's broker`);
      reaped = started.reaped ?? reaped;
    },
    async stop() {
      const was = await stopBroker(opts);
      await reaped?.();
      return was;
    },
    running: async () => (await brokerRunning(opts)) !== undefined,
    async [Symbol.asyncDispose]() {
      if (disposed) return;
      disposed = true;
      await broker.stop();
      await Deno.remove(dir, { recursive: true });
    },
  };
  try {
    await broker.start();
  } catch (error) {
    await broker[Symbol.asyncDispose]().catch(() => {});
    throw error;
  }
  if (!mode.secured) return broker;
  // Made by the start above.
  const material = await ensureSecuredMaterial(dir);
  return Object.assign(broker, {
    sslAddress: `127.0.0.1:${sslPort}`,
    material,
    security: securedClientSecurity(material),
  });
}

/**
 * A consumer of `topic` on `broker` (default: the shared one; secured with
 * `security` when given) from the earliest offset, in a group of its own,
 * collecting into `got` in the background until `consumer.close()`.
 */
export function consume(
  topic: string,
  broker = BROKER,
  security?: KafkaSecurity,
): { got: ConsumedMessage[]; consumer: KafkaConsumer } {
  const consumer = createConsumer({
    brokers: [broker],
    security,
    clientId: "poimen-test",
    groupId: `test-${crypto.randomUUID()}`,
    topics: [topic],
    startFrom: "earliest",
  });
  const got: ConsumedMessage[] = [];
  void (async () => {
    for await (const m of consumer) got.push(m);
  })();
  return { got, consumer };
}

/** A group member in a process of its own, to freeze (SIGSTOP) while it stays in the group. */
export interface MemberProcess {
  pid: number;
  /** Its stdout so far, line by line. */
  out: string[];
  /** Writes one line to its stdin. */
  send(line: string): Promise<void>;
  kill(): Promise<void>;
}

/**
 * Runs `script` (e.g. tests/support/group_member.ts) with `args` in a
 * process of its own, with net, env and read permissions.
 */
export function childMember(script: URL, args: string[]): MemberProcess {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-net", "--allow-env", "--allow-read", script.pathname, ...args],
    stdin: "piped",
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const out: string[] = [];
  const stdin = child.stdin.getWriter();
  const reading = (async () => {
    let pending = "";
    for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
      pending += chunk;
      const lines = pending.split("\n");
      pending = lines.pop()!;
      out.push(...lines);
    }
  })();
  return {
    pid: child.pid,
    out,
    send: (line) => stdin.write(new TextEncoder().encode(`${line}\n`)),
    async kill() {
      try {
        Deno.kill(child.pid, "SIGKILL");
      } catch { /* exited already */ }
      await child.status;
      await stdin.close().catch(() => {});
      await reading.catch(() => {});
    },
  };
}
