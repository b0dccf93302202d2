/**
 * `deno task dispatch <tenant> '<json>'`: publishes one message to
 * `poimen.<tenant>.dispatch`, as an orchestrator would: the value is the
 * `POST /v1/runs` body, the key `<tenant>/<dispatch_key>` (so every
 * redelivery of one spawn lands on one partition). The body is checked
 * against the schema first; `--raw` publishes it unchecked (to try the
 * relay's dead-lettering). `--signal` publishes a signal message to
 * `poimen.<tenant>.signals` instead (`{ run_id, name, payload, signal_id? }`,
 * keyed `<tenant>/<run_id>`). Prints `topic partition offset`.
 */
import { DispatchPublisher, PoimenProblem } from "../client/dispatch.ts";
import { isTenantId } from "../contracts/topics.ts";
import type { RunRequest, SignalMessage } from "../contracts/wire.ts";
import { KafkaCliEnv, readKafkaCliConfig } from "./kafka_config.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";

const COMMAND = {
  name: "dispatch",
  synopsis: "[--raw | --signal] <tenant> '<json body of POST /v1/runs, or a signal message>'",
  description: `
Publishes one message to poimen.<tenant>.dispatch, as an orchestrator would:
the value is the POST /v1/runs body, the key <tenant>/<dispatch_key>. The
body is checked against the schema first; a body without dispatch_key gets
a random one (printed on stderr). With --signal, publishes a signal for a run
to poimen.<tenant>.signals instead: {"run_id","name","payload","signal_id"?},
keyed <tenant>/<run_id>; the signal_id the relay will use is printed on
stderr. Prints "topic partition offset".`,
  flags: {
    raw: { type: "boolean", description: "publish the body unchecked (to try dead-lettering)" },
    signal: { type: "boolean", description: "publish a signal message for a run" },
  },
  positionals: { min: 2, max: 2 },
  env: KafkaCliEnv,
} satisfies CommandSpec;

// A command gives up after about 10 s (at most 21) of retries instead of the
// publisher's "without limit": a broker that is away, or one whose
// certificate is not trusted (node:tls reports it as a connection failure,
// which the library retries), is then one line and exit 1, not a hang.
// A wrong password is not retried at all (the library's AuthenticationError).
const SEND_RETRIES = 8;

export async function main(argv: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, argv);
  if (typeof line === "number") return line;
  const raw = line.flags.raw ?? false;
  const signal = line.flags.signal ?? false;
  const [tenant, value] = line.positionals;
  if (raw && signal) return usageError(COMMAND, "--raw and --signal do not go together");
  if (!isTenantId(tenant)) {
    return usageError(COMMAND, `bad tenant id ${JSON.stringify(tenant)}`);
  }
  let body: unknown;
  if (!raw) {
    try {
      body = JSON.parse(value);
    } catch (err) {
      console.error(`dispatch: the body is not JSON: ${(err as Error).message}`);
      return 65;
    }
  }
  const config = readKafkaCliConfig();
  // The one publisher of dispatch messages (client/dispatch.ts): the same
  // checks, key and headers as any service that imports it.
  const publisher = new DispatchPublisher({
    brokers: config.brokers,
    security: config.security,
    clientId: `${config.KAFKA_CLIENT_ID}-dispatch`,
    retries: SEND_RETRIES,
  });
  try {
    if (signal) {
      const at = await publisher.signal(tenant, body as SignalMessage);
      console.error(`dispatch: signal_id ${at.signalId}`);
      console.log(`${at.topic} ${at.partition} ${at.offset}`);
      return 0;
    }
    const at = raw
      ? await publisher.publishRaw(tenant, value)
      : await publisher.publish(tenant, body as RunRequest);
    if (!raw && at.generatedKey) {
      console.error(`dispatch: dispatch_key ${at.dispatchKey} (generated)`);
    }
    console.log(`${at.topic} ${at.partition} ${at.offset}`);
    return 0;
  } catch (err) {
    if (!(err instanceof PoimenProblem)) throw err;
    for (const e of err.errors) console.error(`dispatch: ${e.path}: ${e.message}`);
    return 65;
  } finally {
    await publisher.close();
  }
}
