/**
 * `deno task up`: the whole system on one machine, for development.
 * Brings up what is not already running (Postgres when it is the local
 * server, the local Kafka broker when KAFKA_BROKERS is the default and no
 * broker answers), migrates and registers the built-in workflows
 * (`init --builtins`), creates a `dev` tenant with a token and its topics,
 * starts api, relay, worker and outbox as child processes with prefixed
 * logs, prints where everything is, and stops them all on Ctrl-C or SIGTERM.
 */
import { z } from "zod";
import {
  DEFAULT_DATABASE_URL,
  DEFAULT_KAFKA_BROKERS,
  DEFAULT_METRICS_PORTS,
  kafkaEnv,
  processEnv,
  readEnv,
} from "../core/config.ts";
import { brokerList, kafkaConnection } from "../kafka/security.ts";
import { ConfigError } from "../core/errors.ts";
import { TENANT_ID_PATTERN } from "../contracts/topics.ts";
import { delay, SECOND } from "../core/time.ts";
import { type CommandSpec, parseCommandLine } from "../core/command_line.ts";
import { PROJECT_ROOT, taskArgs } from "./tasks.ts";
import {
  brokerAddress,
  brokerAnswers,
  type BrokerOptions,
  brokerOptionsFromEnv,
  startBroker,
  stopBroker,
} from "./kafka.ts";
import { ensureSecuredMaterial, securedProcessEnv } from "./kafka_secured.ts";

const UpEnv = z.object({
  DATABASE_URL: z.string().url().default(DEFAULT_DATABASE_URL),
  ...kafkaEnv,
  PORT: z.coerce.number().int().min(1).max(65535).default(8080),
  API_METRICS_PORT: z.coerce.number().int().min(1).max(65535).default(
    DEFAULT_METRICS_PORTS.api,
  ),
  RELAY_METRICS_PORT: z.coerce.number().int().min(1).max(65535).default(
    DEFAULT_METRICS_PORTS.relay,
  ),
  WORKER_METRICS_PORT: z.coerce.number().int().min(1).max(65535).default(
    DEFAULT_METRICS_PORTS.worker,
  ),
  OUTBOX_METRICS_PORT: z.coerce.number().int().min(1).max(65535).default(
    DEFAULT_METRICS_PORTS.outbox,
  ),
  DEV_TENANT: z.string().regex(TENANT_ID_PATTERN).default("dev"),
});

const PROCESSES = ["api", "worker", "outbox", "relay"] as const;

const COMMAND = {
  name: "up",
  synopsis: "[--secured]",
  description: `
Brings the whole system up on this machine, for development: Postgres (the
local server is started if stopped) and Kafka (the local broker is started when
KAFKA_BROKERS is the default and none answers), migrates and registers the
built-in workflows echo, sleep and fail (init --builtins), creates tenant
DEV_TENANT with a token and its topics, starts api, worker, outbox and relay as
child processes with prefixed logs, and prints the URLs, the token and a curl
example. Ctrl-C or SIGTERM stops them all (and the broker, if up started it).
--secured: the local secured broker instead (deno task kafka start --secured),
every process talking to it over SASL_SSL with SCRAM-SHA-512.`,
  flags: {
    secured: {
      type: "boolean",
      description: "use the local secured broker (SASL_SSL, SCRAM) instead of KAFKA_BROKERS",
    },
  },
  env: UpEnv,
} satisfies CommandSpec;

function say(line: string) {
  console.log(`[up] ${line}`);
}

async function run(args: string[], env: Record<string, string> = {}): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), {
    args,
    cwd: PROJECT_ROOT,
    env,
    stdin: "null",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  if (!out.success) {
    throw new Error(`${args.join(" ")} failed:\n${new TextDecoder().decode(out.stderr).trim()}`);
  }
  return text;
}

async function postgresAnswers(url: string): Promise<boolean> {
  const u = new URL(url);
  try {
    const conn = await Deno.connect({ hostname: u.hostname, port: Number(u.port || 5432) });
    conn.close();
    return true;
  } catch {
    return false;
  }
}

async function ensurePostgres(url: string) {
  if (await postgresAnswers(url)) return say(`postgres answers at ${new URL(url).host}`);
  if (url !== DEFAULT_DATABASE_URL) {
    throw new Error(`postgres at ${new URL(url).host} (DATABASE_URL) does not answer`);
  }
  say("starting the local postgres");
  const versions = [...Deno.readDirSync("/etc/postgresql")].map((e) => e.name).sort();
  const out = await new Deno.Command("pg_ctlcluster", {
    args: ["--skip-systemctl-redirect", versions[versions.length - 1], "main", "start"],
  }).output();
  if (!out.success) throw new Error(new TextDecoder().decode(out.stderr).trim());
  const deadline = Date.now() + 30 * SECOND;
  while (!(await postgresAnswers(url))) {
    if (Date.now() > deadline) throw new Error("postgres did not start within 30 s");
    await delay(200);
  }
}

/** Streams a child's output line by line, prefixed with its name. */
async function prefix(
  name: string,
  stream: ReadableStream<Uint8Array>,
  write: (s: string) => void,
) {
  let rest = "";
  const tag = `[${name}]`.padEnd(9);
  for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
    const lines = (rest + chunk).split("\n");
    rest = lines.pop() ?? "";
    for (const l of lines) write(`${tag}${l}\n`);
  }
  if (rest) write(`${tag}${rest}\n`);
}

/** Runs `deno task up` with `args`; resolves to the exit code once everything stopped. */
export async function up(args: string[] = []): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const config = readEnv(UpEnv, processEnv());
  const enc = new TextEncoder();
  const out = (s: string) => Deno.stdout.writeSync(enc.encode(s));

  await ensurePostgres(config.DATABASE_URL);

  let startedBroker: BrokerOptions | undefined;
  const brokers = brokerList(config.KAFKA_BROKERS);
  // What every child is given about Kafka (each also inherits the environment).
  let kafkaVars: Record<string, string> = { KAFKA_BROKERS: config.KAFKA_BROKERS };
  if (line.flags.secured) {
    const opts = { ...brokerOptionsFromEnv(processEnv(), true), report: say };
    say("starting the local secured kafka broker");
    const r = await startBroker(opts);
    if (!r.alreadyRunning) startedBroker = opts;
    kafkaVars = securedProcessEnv(brokerAddress(opts), await ensureSecuredMaterial(opts.dir));
    say(`kafka (SASL_SSL, SCRAM-SHA-512) at ${kafkaVars.KAFKA_BROKERS}, CA ${kafkaVars.DENO_CERT}`);
  } else if (await brokerAnswers(brokers[0], undefined, kafkaConnection(config).security)) {
    say(`kafka answers at ${config.KAFKA_BROKERS}`);
  } else if (config.KAFKA_BROKERS === DEFAULT_KAFKA_BROKERS) {
    say("starting the local kafka broker (first start downloads its jars from Maven Central)");
    const opts = brokerOptionsFromEnv();
    const r = await startBroker(opts);
    if (!r.alreadyRunning) startedBroker = opts;
    say(`kafka up in ${(r.startMs / 1000).toFixed(1)} s at ${config.KAFKA_BROKERS}`);
  } else {
    throw new Error(`kafka at ${config.KAFKA_BROKERS} (KAFKA_BROKERS) does not answer`);
  }

  const env = { DATABASE_URL: config.DATABASE_URL, ...kafkaVars };
  // up creates its tenant itself (below): init only migrates and registers the built-ins here.
  await run(taskArgs("init").concat("--builtins"), { ...env, POIMEN_TENANTS: "" });
  say("database migrated, built-in workflows registered (echo, sleep, fail)");
  const token = await run(taskArgs("token").concat(config.DEV_TENANT), env);
  const relayToken = await run(taskArgs("token").concat("--service", "relay"), env);
  await run(taskArgs("topics").concat(config.DEV_TENANT), env);
  say(`tenant ${config.DEV_TENANT}: token created, topics declared`);

  const apiUrl = `http://127.0.0.1:${config.PORT}`;
  const childEnv: Record<string, Record<string, string>> = {
    api: { ...env, PORT: String(config.PORT), API_METRICS_PORT: String(config.API_METRICS_PORT) },
    worker: { ...env, WORKER_METRICS_PORT: String(config.WORKER_METRICS_PORT) },
    outbox: { ...env, OUTBOX_METRICS_PORT: String(config.OUTBOX_METRICS_PORT) },
    relay: {
      ...env,
      API_URL: apiUrl,
      RELAY_TOKEN: relayToken,
      RELAY_METRICS_PORT: String(config.RELAY_METRICS_PORT),
    },
  };
  const children = PROCESSES.map((name) => {
    const child = new Deno.Command(Deno.execPath(), {
      args: taskArgs(name),
      cwd: PROJECT_ROOT,
      env: childEnv[name],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    prefix(name, child.stdout, out);
    prefix(name, child.stderr, out);
    return { name, child };
  });

  // "Up" once the API is ready and every other process answers /healthz:
  // each then handles Ctrl-C itself (a process still loading its modules
  // would die of it, not stop).
  const ready = Date.now() + 30 * SECOND;
  const waits: [string, string][] = [
    ["api", `${apiUrl}/readyz`],
    ["worker", `http://127.0.0.1:${config.WORKER_METRICS_PORT}/healthz`],
    ["outbox", `http://127.0.0.1:${config.OUTBOX_METRICS_PORT}/healthz`],
    ["relay", `http://127.0.0.1:${config.RELAY_METRICS_PORT}/healthz`],
  ];
  for (const [name, url] of waits) {
    while (!(await fetch(url).then((r) => r.ok, () => false))) {
      if (Date.now() > ready) throw new Error(`the ${name} did not answer at ${url}`);
      await delay(200);
    }
  }

  // Each serves /metrics, /healthz and /readyz on the port shown (the API
  // port's /metrics has only the series that name no tenant).
  const ports = `
  api           http://127.0.0.1:${config.API_METRICS_PORT}
  worker        http://127.0.0.1:${config.WORKER_METRICS_PORT}
  outbox        http://127.0.0.1:${config.OUTBOX_METRICS_PORT}
  relay         http://127.0.0.1:${config.RELAY_METRICS_PORT}`;
  say("poimen is up:");
  out(`
  API           ${apiUrl}  (OpenAPI: ${apiUrl}/openapi.json)
  Postgres      ${new URL(config.DATABASE_URL).host}${new URL(config.DATABASE_URL).pathname}
  Kafka         ${kafkaVars.KAFKA_BROKERS}  (topics poimen.${config.DEV_TENANT}.events|dispatch|dispatch.dlq|signals)
  tenant        ${config.DEV_TENANT}
  token         ${token}

  /metrics, /healthz (alive) and /readyz (dependencies answer) of each process:${ports}

  Try:
    curl -s -X POST ${apiUrl}/v1/runs \\
      -H 'authorization: Bearer ${token}' -H 'content-type: application/json' \\
      -d '{"workflow_ref":"echo","input":{"hello":"world"},"dispatch_key":"first"}'
    ${
    line.flags.secured
      ? Object.entries(kafkaVars).map(([k, v]) => `${k}=${v}`).join(" ") + " \\\n      "
      : ""
  }deno task dispatch ${config.DEV_TENANT} '{"workflow_ref":"echo","input":{},"dispatch_key":"via-kafka"}'

  Ctrl-C stops everything.
`);

  const stopped = Promise.withResolvers<void>();
  for (const sig of ["SIGINT", "SIGTERM"] as const) Deno.addSignalListener(sig, stopped.resolve);
  const exited = Promise.race(
    children.map(async ({ name, child }) => ({ name, status: await child.status })),
  );
  const first = await Promise.race([stopped.promise.then(() => undefined), exited]);
  if (first) say(`${first.name} exited with code ${first.status.code}; stopping the others`);
  else say("stopping");
  for (const { child } of children) {
    try {
      child.kill("SIGTERM");
    } catch { /* already exited */ }
  }
  await Promise.all(children.map(({ child }) => child.status));
  if (startedBroker) {
    await stopBroker(startedBroker);
    say("kafka stopped");
  }
  say("all stopped");
  return first ? 1 : 0;
}

if (import.meta.main) {
  try {
    Deno.exit(await up(Deno.args));
  } catch (err) {
    console.error(err instanceof ConfigError ? err.message : `up: ${(err as Error).message}`);
    Deno.exit(err instanceof ConfigError ? 2 : 1);
  }
}
