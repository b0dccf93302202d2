/**
 * The system under chaos, all of it private to one run: a Kafka broker of its
 * own (free ports, data in the run's directory), a database of its own
 * (`poimen_chaos_<random>`, dropped at the end) on the machine's Postgres,
 * and the real poimen processes (`deno run <task permissions> main.ts …`):
 * one API on a fixed port, two relays in one consumer group, two workers
 * (hosting the `workflowsModule` given, or the built-ins) and an outbox. A
 * supervisor restarts any process that exits, as an orchestrator would, and
 * tells a crash (an exit nobody asked for) from a kill. The faults themselves
 * are methods here; when to inject them is the caller's business.
 */
import { restartPostgresCluster } from "./postgres_restart.ts";
import { type BrokerOptions, brokerOptionsFromEnv, killBroker, startBroker } from "../kafka.ts";
import { freePort, PoimenProcess, runCommand, runFlags } from "../processes.ts";
import { createPool, type Sql } from "../../db/pool.ts";
import { registeredWorkflows } from "./observe.ts";
import { delay, SECOND } from "../../core/time.ts";

/** What a run of the chaos harness needs to build its cluster. */
export interface ClusterOptions {
  /** The run's directory: broker data and process logs. */
  dir: string;
  /** Any database URL of the Postgres server to use; the chaos database is created next to it. */
  databaseUrl: string;
  /** The tenants to create, with tokens and topics. */
  tenants: string[];
  /** The API's body limit (oversized poison is made to exceed it). */
  bodyLimit: number;
  /** Really restart the Postgres cluster (pg_ctlcluster) instead of killing connections. */
  pgRestart: boolean;
  /** The workers' `--workflows` module (an absolute path); unset: the built-ins. */
  workflowsModule?: string;
  /** More of the workers' environment (e.g. WORKER_SUSPEND_AFTER_MS). */
  workerEnv?: Record<string, string>;
  /** Workflow names setUp waits for in the catalog (registered by a worker) before it resolves. */
  workflows?: string[];
  say: (line: string) => void;
}

/**
 * A free port below the kernel's ephemeral range. The broker and the API are
 * restarted on the same port again and again; a port from the ephemeral range
 * could meanwhile become the local end of some outgoing connection.
 */
function stablePort(): number {
  let low = 32768;
  try {
    low = Number(
      Deno.readTextFileSync("/proc/sys/net/ipv4/ip_local_port_range").trim().split(/\s+/)[0],
    );
  } catch { /* not Linux: assume the usual range */ }
  for (let attempt = 0; attempt < 100; attempt++) {
    const port = 10_000 + Math.floor(Math.random() * Math.max(1, low - 10_000));
    try {
      Deno.listen({ hostname: "127.0.0.1", port }).close();
      return port;
    } catch { /* taken: another */ }
  }
  return freePort();
}

/** The process roles faults pick from. */
export type ProcessRole = "api" | "relay" | "worker" | "outbox";

const RELAY_GROUP = "poimen-chaos-relay";
const TOPIC_RETENTION_MS = 3_600_000;

/** One supervised process slot: restarted whenever it exits, until the cluster stops. */
class Slot {
  readonly name: string;
  readonly role: ProcessRole;
  readonly #env: () => Record<string, string>;
  readonly #args: string[];
  readonly #dir: string;
  readonly #say: (line: string) => void;
  #proc: PoimenProcess | undefined;
  #incarnation = 0;
  #killed = new WeakSet<PoimenProcess>();
  #stopping = false;
  #restart: ReturnType<typeof setTimeout> | undefined;
  /** Exits nobody asked for: name, code and the last lines it wrote. */
  readonly crashes: string[] = [];

  constructor(
    name: string,
    role: ProcessRole,
    env: () => Record<string, string>,
    dir: string,
    say: (line: string) => void,
    args: string[] = [],
  ) {
    this.name = name;
    this.role = role;
    this.#env = env;
    this.#args = args;
    this.#dir = dir;
    this.#say = say;
  }

  get running(): boolean {
    return this.#proc !== undefined && !this.#proc.exited;
  }

  /** Where the running incarnation serves /metrics, /healthz and /readyz (worker, outbox, relay). */
  get metricsUrl(): string | undefined {
    return this.running ? this.#proc?.metricsUrl : undefined;
  }

  start(): void {
    if (this.#stopping || this.running) return;
    const incarnation = ++this.#incarnation;
    const proc = new PoimenProcess(this.role, this.#env(), this.#args);
    this.#proc = proc;
    void proc.status().then(async (status) => {
      const lines = proc.logs();
      await Deno.writeTextFile(
        `${this.#dir}/${this.name}.${incarnation}.log`,
        lines.join("\n") + "\n",
      ).catch(() => {});
      if (this.#killed.has(proc) || this.#stopping) return;
      // The uncaught error and where it was thrown, or else the last words.
      const at = lines.findLastIndex((l) => /^error: /.test(l));
      const tail = (at >= 0 ? lines.slice(at, at + 5) : lines.slice(-3))
        .map((l) => l.trim()).join(" | ").slice(0, 600);
      this.crashes.push(`${this.name}#${incarnation} exited with code ${status.code}: ${tail}`);
      this.#say(`${this.name} exited on its own (code ${status.code}); restarting it`);
      this.#restart = setTimeout(() => this.start(), SECOND);
    });
  }

  /** SIGKILL; the slot stays down until `start()`. */
  async kill(): Promise<void> {
    const proc = this.#proc;
    if (!proc || proc.exited) return;
    this.#killed.add(proc);
    await proc.stop("SIGKILL");
  }

  /** SIGTERM (SIGKILL after 15 s) and no more restarts; resolves with the exit code. */
  async stop(): Promise<number | undefined> {
    this.#stopping = true;
    clearTimeout(this.#restart);
    const proc = this.#proc;
    if (!proc) return undefined;
    return (await proc.stop("SIGTERM", 15 * SECOND)).code;
  }
}

/** The private cluster of one chaos run. */
export class Cluster {
  readonly #opts: ClusterOptions;
  readonly broker: BrokerOptions;
  readonly brokers: string[];
  readonly dbName = `poimen_chaos_${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`;
  readonly dbUrl: string;
  readonly #adminUrl: string;
  readonly apiPort = stablePort();
  readonly apiUrl: string;
  readonly relayGroup = RELAY_GROUP;
  /** Each tenant's own token, for HTTP callers. */
  readonly tenantTokens = new Map<string, string>();
  #serviceToken = "";
  #admin: Sql | undefined;
  #sql: Sql | undefined;
  #dbCreated = false;
  #slots: Slot[] = [];

  constructor(opts: ClusterOptions) {
    this.#opts = opts;
    this.broker = {
      port: stablePort(),
      controllerPort: stablePort(),
      dir: `${opts.dir}/kafka`,
      // The jars are shared with the development broker (read only).
      libs: brokerOptionsFromEnv().libs,
      heap: "384m",
    };
    this.brokers = [`127.0.0.1:${this.broker.port}`];
    const admin = new URL(opts.databaseUrl);
    admin.pathname = "/postgres";
    this.#adminUrl = admin.href;
    const db = new URL(opts.databaseUrl);
    db.pathname = `/${this.dbName}`;
    this.dbUrl = db.href;
    this.apiUrl = `http://127.0.0.1:${this.apiPort}`;
  }

  /** A pool on the chaos database (for the checks; faults kill its connections too). */
  get sql(): Sql {
    return this.#sql ??= createPool({ url: this.dbUrl, max: 2, applicationName: "poimen-chaos" });
  }

  get #adminSql(): Sql {
    return this.#admin ??= createPool({
      url: this.#adminUrl,
      max: 1,
      applicationName: "poimen-chaos-admin",
    });
  }

  /** The environment every poimen process of this cluster shares. */
  #baseEnv(): Record<string, string> {
    return {
      DATABASE_URL: this.dbUrl,
      KAFKA_BROKERS: this.brokers.join(","),
      // Info is a few lines per process and start; kept per incarnation in the run's logs/.
      LOG_LEVEL: "info",
      TOPIC_PARTITIONS: "3",
      TOPIC_RETENTION_MS: String(TOPIC_RETENTION_MS),
    };
  }

  /**
   * Broker, database, migrations, tenants, tokens, topics, processes;
   * resolves when the API is ready and `workflows` are in the catalog.
   */
  async setUp(): Promise<void> {
    const { say } = this.#opts;
    await Deno.mkdir(`${this.#opts.dir}/logs`, { recursive: true });
    const started = await startBroker({ ...this.broker, report: (l) => say(`broker: ${l}`) });
    if (started.alreadyRunning) {
      throw new Error("a broker already answers on the chaos broker's port");
    }

    await this.#adminSql.unsafe(`create database ${this.dbName}`);
    this.#dbCreated = true;
    const env = this.#baseEnv();
    await this.#command("migrate", [], env);
    for (const tenant of this.#opts.tenants) {
      this.tenantTokens.set(tenant, await this.#command("token", [tenant], env));
    }
    this.#serviceToken = await this.#command("token", ["--service", "chaos-relay"], env);
    await this.#command("topics", this.#opts.tenants, env);
    say(`database ${this.dbName}, tenants ${this.#opts.tenants.join(", ")}, topics declared`);

    const logs = `${this.#opts.dir}/logs`;
    const slot = (
      name: string,
      role: ProcessRole,
      env: () => Record<string, string>,
      args: string[] = [],
    ) => new Slot(name, role, () => ({ ...this.#baseEnv(), ...env() }), logs, say, args);
    const module = this.#opts.workflowsModule;
    const workerArgs = module === undefined ? [] : ["--workflows", module];
    this.#slots = [
      slot("api", "api", () => ({
        PORT: String(this.apiPort),
        HOST: "127.0.0.1",
        BODY_LIMIT_BYTES: String(this.#opts.bodyLimit),
        // Lease expiries after worker kills count as attempts; echo must not run out of them.
        DEFAULT_MAX_ATTEMPTS: "10",
      })),
      ...[1, 2].map((n) =>
        slot(`relay-${n}`, "relay", () => ({
          API_URL: this.apiUrl,
          RELAY_TOKEN: this.#serviceToken,
          RELAY_GROUP_ID: RELAY_GROUP,
          RELAY_TOPIC_REFRESH_MS: "1000",
          RELAY_LAG_INTERVAL_MS: "1000",
          RELAY_BACKOFF_BASE_MS: "100",
          RELAY_BACKOFF_CAP_MS: "2000",
          RELAY_API_TIMEOUT_MS: "10000",
          // Unknown-workflow poison is dead-lettered after this grace (5 min by default).
          RELAY_UNKNOWN_WORKFLOW_GRACE_MS: "3000",
          // The shortest the broker allows: a killed relay's partitions move on soon.
          RELAY_SESSION_TIMEOUT_MS: "6000",
        }))
      ),
      ...[1, 2].map((n) =>
        slot(`worker-${n}`, "worker", () => ({
          WORKER_CONCURRENCY: "8",
          // A killed worker's runs are reclaimed within seconds.
          WORKER_LEASE_MS: "3000",
          WORKER_POLL_MS: "500",
          WORKER_RETRY_BASE_MS: "200",
          ...this.#opts.workerEnv,
        }), workerArgs)
      ),
      slot("outbox", "outbox", () => ({
        OUTBOX_POLL_MS: "100",
        OUTBOX_SEND_TIMEOUT_MS: "10000",
        OUTBOX_RETRY_MAX_MS: "2000",
      })),
    ];
    for (const s of this.#slots) s.start();
    await this.apiReady(60 * SECOND);
    await this.#registered(this.#opts.workflows ?? [], 60 * SECOND);
    say(`processes up: ${this.#slots.map((s) => s.name).join(", ")}; api ${this.apiUrl}`);
  }

  async #command(command: string, args: string[], env: Record<string, string>): Promise<string> {
    const out = await runCommand(command, args, env, runFlags(command));
    if (out.code !== 0) {
      throw new Error(`${command} ${args.join(" ")} failed (${out.code}): ${out.stderr.trim()}`);
    }
    return out.stdout.trim();
  }

  /** Resolves once the API answers /readyz with 200; throws after `timeoutMs`. */
  async apiReady(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const ok = await fetch(`${this.apiUrl}/readyz`, { signal: AbortSignal.timeout(2 * SECOND) })
        .then(async (r) => {
          await r.body?.cancel();
          return r.status === 200;
        }, () => false);
      if (ok) return;
      await delay(200);
    }
    throw new Error(`the api did not become ready at ${this.apiUrl}`);
  }

  /**
   * Resolves once every workflow of `names` is in the catalog (a worker
   * registers what it hosts as it starts): published before, a run of one
   * would wait for the relay's unknown-workflow grace, or be dead-lettered.
   */
  async #registered(names: string[], timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (true) {
      const known = await registeredWorkflows(this.sql, names).catch(() => new Set<string>());
      const missing = names.filter((n) => !known.has(n));
      if (missing.length === 0) return;
      if (Date.now() > deadline) {
        throw new Error(`no worker registered ${missing.join(", ")} within ${timeoutMs} ms`);
      }
      await delay(200);
    }
  }

  /** Names of the slots of `role`. */
  slots(role: ProcessRole): string[] {
    return this.#slots.filter((s) => s.role === role).map((s) => s.name);
  }

  /** SIGKILLs process `name`, then starts it again after `downMs`. */
  async killProcess(name: string, downMs: number): Promise<void> {
    const slot = this.#slots.find((s) => s.name === name);
    if (!slot) throw new Error(`no process ${name}`);
    await slot.kill();
    await delay(downMs);
    slot.start();
  }

  /** SIGKILLs the broker, then starts it again after `downMs`; resolves when it answers. */
  async crashBroker(downMs: number): Promise<void> {
    await killBroker(this.broker);
    await delay(downMs);
    await startBroker(this.broker);
  }

  /**
   * The Postgres fault. By default a connection kill: every backend of the
   * chaos database is terminated, again and again for `downMs`, so whatever
   * reconnects in that window is cut off too (the machine's cluster is shared
   * and stays up). With `pgRestart`, the cluster is really restarted
   * (`pg_ctlcluster … restart -m immediate`). Resolves with the number of
   * backends killed (0 for a restart).
   */
  async postgresFault(downMs: number): Promise<number> {
    if (this.#opts.pgRestart) {
      await restartPostgresCluster();
      return 0;
    }
    const until = Date.now() + downMs;
    let killed = 0;
    do {
      const [row] = await this.#adminSql<{ n: number }[]>`
        select count(*) filter (where pg_terminate_backend(pid))::int as n
          from pg_stat_activity
         where datname = ${this.dbName} and pid <> pg_backend_pid()`;
      killed += row.n;
      await delay(100);
    } while (Date.now() < until);
    return killed;
  }

  /** Exits of processes nobody killed. */
  crashes(): string[] {
    return this.#slots.flatMap((s) => s.crashes);
  }

  /** Whether every process is running (none waiting for its restart). */
  allRunning(): boolean {
    return this.#slots.every((s) => s.running);
  }

  /**
   * Stops the processes (SIGTERM), the relays first so that nothing is
   * admitted while the rest stops; returns those that did not exit with 0.
   */
  async stopProcesses(): Promise<string[]> {
    const stop = (slots: Slot[]) =>
      Promise.all(slots.map(async (s) => [s.name, await s.stop()] as const));
    const codes = [
      ...await stop(this.#slots.filter((s) => s.role === "relay")),
      ...await stop(this.#slots.filter((s) => s.role !== "relay")),
    ];
    return codes.filter(([, code]) => code !== undefined && code !== 0).map(([n, c]) =>
      `${n} exited with ${c} on SIGTERM`
    );
  }

  /** Each relay's /healthz (its `pending` messages), for a report on a drain that stalled. */
  async relayHealth(): Promise<string[]> {
    return await Promise.all(
      this.#slots.filter((s) => s.role === "relay").map(async (s) => {
        const url = s.metricsUrl;
        if (!url) return `${s.name}: not running`;
        try {
          const res = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2 * SECOND) });
          return `${s.name}: ${(await res.text()).trim()}`;
        } catch (error) {
          return `${s.name}: ${error instanceof Error ? error.message : error}`;
        }
      }),
    );
  }

  /** Everything down and removed: processes, broker, database. Safe to call twice. */
  async tearDown(): Promise<void> {
    await Promise.all(this.#slots.map((s) => s.stop().catch(() => undefined)));
    await killBroker(this.broker).catch(() => {});
    await this.#sql?.end({ timeout: 1 }).catch(() => {});
    this.#sql = undefined;
    if (this.#dbCreated) {
      await this.#adminSql.unsafe(`drop database if exists ${this.dbName} with (force)`);
      this.#dbCreated = false;
    }
    await this.#admin?.end({ timeout: 1 }).catch(() => {});
    this.#admin = undefined;
    await Deno.remove(this.broker.dir, { recursive: true }).catch(() => {});
  }
}
