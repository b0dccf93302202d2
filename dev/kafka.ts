/**
 * A real single-node Apache Kafka (KRaft, combined broker + controller) for
 * local development and tests, assembled from Maven Central jars: no Docker.
 *
 *   deno task kafka start|stop|status      (dev/kafka_command.ts)
 *
 * Jars are copied once into `<KAFKA_DIR>/libs` (dev/kafka/pom.xml), storage
 * is formatted on the first start only, so data survives stop/start. The JVM
 * runs detached (own process group) and outlives this script; its pid is in
 * `<KAFKA_DIR>/broker.pid`, its output in `<KAFKA_DIR>/broker.log`.
 *
 * Environment: KAFKA_PORT (9092), KAFKA_CONTROLLER_PORT (9093), KAFKA_DIR
 * (`.kafka`, relative to the project root), KAFKA_HEAP (512m).
 *
 * Secured (`start --secured`, dev/kafka_secured.ts): another broker, in
 * `<KAFKA_DIR>/secured` (jars shared), SASL_SSL on KAFKA_SECURED_PORT (9094),
 * mTLS on KAFKA_SECURED_SSL_PORT (9095), controller on
 * KAFKA_SECURED_CONTROLLER_PORT (9096).
 */
import { z } from "zod";
import { port, readEnv } from "../core/config.ts";
import { delay, SECOND } from "../core/time.ts";
import { createAdmin } from "../kafka/admin.ts";
import type { KafkaSecurity } from "../kafka/security.ts";
import { ensureFormatted, ensureJars, javaArgs } from "./kafka_storage.ts";
import {
  ensureSecuredMaterial,
  securedClientSecurity,
  securedListenerProperties,
  type SecuredMaterial,
} from "./kafka_secured.ts";

const ROOT = decodeURIComponent(new URL("..", import.meta.url).pathname).replace(/\/$/, "");

const START_DEADLINE = 90 * SECOND;
const STOP_DEADLINE = 60 * SECOND;

/** The variables of the development broker. */
export const kafkaDevEnv = z.object({
  KAFKA_PORT: port(9092),
  KAFKA_CONTROLLER_PORT: port(9093),
  KAFKA_DIR: z.string().min(1).default(".kafka"),
  KAFKA_HEAP: z.string().regex(/^\d+[mg]$/, "expected e.g. 512m").default("512m"),
  KAFKA_SECURED_PORT: port(9094),
  KAFKA_SECURED_SSL_PORT: port(9095),
  KAFKA_SECURED_CONTROLLER_PORT: port(9096),
});

/** Where and how the development broker runs. */
export interface BrokerOptions {
  port: number;
  controllerPort: number;
  /** Absolute directory holding data/, broker.log, broker.pid (and libs/ by default). */
  dir: string;
  /** Absolute directory of the jars; several brokers (e.g. a test's own) may share one. */
  libs: string;
  heap: string;
  /**
   * Present: the secured mode (dev/kafka_secured.ts): `port` is SASL_SSL,
   * `sslPort` SSL with client certificates.
   */
  secured?: { sslPort: number };
  /** Receives one human-readable line per step (default: discarded). */
  report?: (line: string) => void;
}

/**
 * Broker options from the environment (KAFKA_PORT, KAFKA_CONTROLLER_PORT,
 * KAFKA_DIR, KAFKA_HEAP; the KAFKA_SECURED_* ports when `secured`).
 */
export function brokerOptionsFromEnv(
  env: Record<string, string | undefined> = Deno.env.toObject(),
  secured = false,
): BrokerOptions {
  const e = readEnv(kafkaDevEnv, env);
  const dir = e.KAFKA_DIR.startsWith("/") ? e.KAFKA_DIR : `${ROOT}/${e.KAFKA_DIR}`;
  if (secured) {
    return {
      port: e.KAFKA_SECURED_PORT,
      controllerPort: e.KAFKA_SECURED_CONTROLLER_PORT,
      secured: { sslPort: e.KAFKA_SECURED_SSL_PORT },
      dir: `${dir}/secured`,
      libs: `${dir}/libs`,
      heap: e.KAFKA_HEAP,
    };
  }
  return {
    port: e.KAFKA_PORT,
    controllerPort: e.KAFKA_CONTROLLER_PORT,
    dir,
    libs: `${dir}/libs`,
    heap: e.KAFKA_HEAP,
  };
}

/** The bootstrap address of the development broker. */
export function brokerAddress(opts: BrokerOptions = brokerOptionsFromEnv()): string {
  return `127.0.0.1:${opts.port}`;
}

async function readPid(dir: string): Promise<number | undefined> {
  try {
    const pid = Number((await Deno.readTextFile(`${dir}/broker.pid`)).trim());
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

async function alive(pid: number): Promise<boolean> {
  try {
    Deno.kill(pid, 0);
  } catch {
    return false;
  }
  // The pid may have been recycled by another process, or be a zombie; ps
  // tells (/proc/<pid> would need --allow-all under Deno 2).
  try {
    const out = await new Deno.Command("ps", { args: ["-o", "args=", "-p", String(pid)] }).output();
    return new TextDecoder().decode(out.stdout).includes("kafka.Kafka");
  } catch {
    return true;
  }
}

/** The pid of the running development broker, or undefined. */
export async function brokerRunning(
  opts: BrokerOptions = brokerOptionsFromEnv(),
): Promise<number | undefined> {
  const pid = await readPid(opts.dir);
  return pid !== undefined && (await alive(pid)) ? pid : undefined;
}

function serverProperties(opts: BrokerOptions, material?: SecuredMaterial): string {
  const listeners = opts.secured && material
    ? securedListenerProperties({ ...opts, sslPort: opts.secured.sslPort }, material)
    : [
      `listeners=PLAINTEXT://127.0.0.1:${opts.port},CONTROLLER://127.0.0.1:${opts.controllerPort}`,
      `advertised.listeners=PLAINTEXT://127.0.0.1:${opts.port}`,
      "controller.listener.names=CONTROLLER",
      "inter.broker.listener.name=PLAINTEXT",
      "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    ];
  return [
    "# Written by dev/kafka.ts on every start; edit that file, not this one.",
    "process.roles=broker,controller",
    "node.id=1",
    `controller.quorum.bootstrap.servers=127.0.0.1:${opts.controllerPort}`,
    ...listeners,
    `log.dirs=${opts.dir}/data`,
    "num.partitions=1",
    "default.replication.factor=1",
    "min.insync.replicas=1",
    "offsets.topic.replication.factor=1",
    "offsets.topic.num.partitions=10",
    "transaction.state.log.replication.factor=1",
    "transaction.state.log.min.isr=1",
    "share.coordinator.state.topic.replication.factor=1",
    "share.coordinator.state.topic.min.isr=1",
    // Single member groups in tests and dev: no reason to wait for more.
    "group.initial.rebalance.delay.ms=0",
    // Topics are declared by poimen with their partitions and retention.
    "auto.create.topics.enable=false",
    "",
  ].join("\n");
}

/** True when a Kafka broker answers a metadata request on `address`. */
export async function brokerAnswers(
  address: string,
  timeoutMs = 2 * SECOND,
  security?: KafkaSecurity,
): Promise<boolean> {
  const admin = createAdmin({
    brokers: [address],
    security,
    clientId: "poimen-dev-kafka",
    requestTimeoutMs: timeoutMs,
    connectTimeoutMs: timeoutMs,
    retries: 0,
  });
  try {
    await admin.listTopics();
    return true;
  } catch {
    return false;
  } finally {
    await admin.close().catch(() => {});
  }
}

async function logTail(dir: string, lines = 40): Promise<string> {
  const text = await Deno.readTextFile(`${dir}/broker.log`).catch(() => "");
  return text.trimEnd().split("\n").slice(-lines).join("\n");
}

/** Result of `startBroker`. */
export interface StartResult {
  pid: number | undefined;
  alreadyRunning: boolean;
  /** Time from spawning the JVM until a client request succeeded, in ms (0 if already running). */
  startMs: number;
  /**
   * Waits until the JVM this call spawned has exited and been reaped (absent
   * when it spawned none). A test calls it after stopping the broker, so the
   * child leaves nothing behind for its sanitizers.
   */
  reaped?: () => Promise<void>;
}

/**
 * Starts the development broker unless it runs; resolves once it answers
 * client requests. Throws (with the log's tail in the message) when it does
 * not within 90 s.
 */
export async function startBroker(
  opts: BrokerOptions = brokerOptionsFromEnv(),
): Promise<StartResult> {
  const report = opts.report ?? (() => {});
  const address = brokerAddress(opts);
  await Deno.mkdir(opts.dir, { recursive: true });
  const material = opts.secured ? await ensureSecuredMaterial(opts.dir, report) : undefined;
  const security = material ? securedClientSecurity(material) : undefined;
  const running = await brokerRunning(opts);
  if (running !== undefined) {
    report(`kafka already running (pid ${running}) on ${address}`);
    return { pid: running, alreadyRunning: true, startMs: 0 };
  }
  if (await brokerAnswers(address, 2 * SECOND, security)) {
    // E.g. a broker from compose.yaml or CI: use it, it is not ours to manage.
    report(`a kafka broker not started by this script already answers on ${address}`);
    return { pid: undefined, alreadyRunning: true, startMs: 0 };
  }

  await ensureJars(opts, report);
  await Deno.writeTextFile(`${opts.dir}/server.properties`, serverProperties(opts, material), {
    mode: 0o600,
  });
  await ensureFormatted(opts, report, material);

  report(`starting kafka on ${address} (controller 127.0.0.1:${opts.controllerPort})`);
  const started = performance.now();
  const log = `${opts.dir}/broker.log`;
  const args = javaArgs(opts, "kafka.Kafka", [`${opts.dir}/server.properties`]);
  // sh only redirects and then becomes the JVM (exec), so the pid is the JVM's;
  // detached puts it in its own process group, away from our terminal's signals.
  const child = new Deno.Command("sh", {
    args: ["-c", 'exec "$0" "$@" >>"$KAFKA_BROKER_LOG" 2>&1 </dev/null', "java", ...args],
    env: { KAFKA_BROKER_LOG: log },
    stdin: "null",
    stdout: "null",
    stderr: "null",
    detached: true,
  }).spawn();
  child.unref();
  const pid = child.pid;
  await Deno.writeTextFile(`${opts.dir}/broker.pid`, `${pid}\n`);

  let exited = false;
  child.status.then(() => (exited = true), () => (exited = true));
  const reaped = async () => {
    // The child is unref'd so this script can exit while it runs; waiting
    // for it must keep the event loop alive again.
    child.ref();
    await child.status.catch(() => {});
  };
  const deadline = Date.now() + START_DEADLINE;
  while (Date.now() < deadline) {
    // Our own child: its exit status is authoritative (right after spawn,
    // /proc may still show this process's command line, not the JVM's).
    if (exited) {
      await Deno.remove(`${opts.dir}/broker.pid`).catch(() => {});
      throw new Error(
        `kafka exited during start-up; last lines of ${log}:\n${await logTail(opts.dir)}`,
      );
    }
    if (await brokerAnswers(address, SECOND, security)) {
      const startMs = Math.round(performance.now() - started);
      report(`kafka ready on ${address} (pid ${pid}) after ${(startMs / SECOND).toFixed(1)} s`);
      return { pid, alreadyRunning: false, startMs, reaped };
    }
    await delay(250);
  }
  throw new Error(
    `kafka did not answer on ${address} within ${START_DEADLINE / SECOND} s; ` +
      `last lines of ${log}:\n${await logTail(opts.dir)}`,
  );
}

/**
 * Stops the development broker (SIGTERM, then SIGKILL after 60 s) and waits
 * until it exited. Resolves false when it was not running.
 */
export async function stopBroker(opts: BrokerOptions = brokerOptionsFromEnv()): Promise<boolean> {
  const report = opts.report ?? (() => {});
  const pid = await brokerRunning(opts);
  if (pid === undefined) {
    report("kafka is not running");
    await Deno.remove(`${opts.dir}/broker.pid`).catch(() => {});
    return false;
  }
  report(`stopping kafka (pid ${pid})`);
  const started = performance.now();
  try {
    Deno.kill(pid, "SIGTERM");
  } catch { /* already gone */ }
  const deadline = Date.now() + STOP_DEADLINE;
  while (await alive(pid)) {
    if (Date.now() > deadline) {
      report(`kafka did not stop within ${STOP_DEADLINE / SECOND} s, killing it`);
      try {
        Deno.kill(pid, "SIGKILL");
      } catch { /* already gone */ }
      while (await alive(pid)) await delay(100);
      break;
    }
    await delay(100);
  }
  await Deno.remove(`${opts.dir}/broker.pid`).catch(() => {});
  report(`kafka stopped after ${((performance.now() - started) / SECOND).toFixed(1)} s`);
  return true;
}

/**
 * Crashes the development broker: SIGKILL, no shutdown, as a power cut of
 * the process (not of the machine: what the broker acknowledged is in the
 * page cache). Resolves once it is gone; false when it was not running.
 */
export async function killBroker(opts: BrokerOptions = brokerOptionsFromEnv()): Promise<boolean> {
  const pid = await brokerRunning(opts);
  if (pid === undefined) return false;
  try {
    Deno.kill(pid, "SIGKILL");
  } catch { /* already gone */ }
  while (await alive(pid)) await delay(50);
  return true;
}
