/**
 * `deno task dispatch <tenant> '<json>'`: publishes one message to
 * `poimen.<tenant>.dispatch`, as an orchestrator would: the value is the
 * `POST /v1/runs` body, the key `<tenant>/<dispatch_key>` (so every
 * redelivery of one spawn lands on one partition). The body is checked
 * against the schema first; `--raw` publishes it unchecked (to try the
 * relay's dead-lettering). Prints `topic partition offset`.
 */
import { formatPath, RunRequest } from "../contracts/runs.ts";
import { createProducer } from "../kafka/producer.ts";
import { dispatchMessageKey, dispatchTopic, isTenantId } from "../contracts/topics.ts";
import { KafkaCliEnv, readKafkaCliConfig } from "./kafka_config.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";

const COMMAND = {
  name: "dispatch",
  synopsis: "[--raw] <tenant> '<json body of POST /v1/runs>'",
  description: `
Publishes one message to poimen.<tenant>.dispatch, as an orchestrator would:
the value is the POST /v1/runs body, the key <tenant>/<dispatch_key>. The
body is checked against the schema first. Prints "topic partition offset".`,
  flags: {
    raw: { type: "boolean", description: "publish the body unchecked (to try dead-lettering)" },
  },
  positionals: { min: 2, max: 2 },
  env: KafkaCliEnv,
} satisfies CommandSpec;

export async function main(argv: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, argv);
  if (typeof line === "number") return line;
  const raw = line.flags.raw ?? false;
  const [tenant, value] = line.positionals;
  if (!isTenantId(tenant)) {
    return usageError(COMMAND, `bad tenant id ${JSON.stringify(tenant)}`);
  }
  let dispatchKey: string | undefined;
  if (!raw) {
    let body: unknown;
    try {
      body = JSON.parse(value);
    } catch (err) {
      console.error(`dispatch: the body is not JSON: ${(err as Error).message}`);
      return 65;
    }
    const parsed = RunRequest.safeParse(body);
    if (!parsed.success) {
      const i = parsed.error.issues[0];
      console.error(`dispatch: ${formatPath(i.path) || "body"}: ${i.message}`);
      return 65;
    }
    dispatchKey = parsed.data.dispatch_key ?? undefined;
  }
  const config = readKafkaCliConfig();
  const producer = createProducer({
    brokers: config.brokers,
    clientId: `${config.KAFKA_CLIENT_ID}-dispatch`,
  });
  try {
    const [at] = await producer.send([{
      topic: dispatchTopic(tenant),
      key: dispatchMessageKey(tenant, dispatchKey),
      value,
    }]);
    console.log(`${at.topic} ${at.partition} ${at.offset}`);
    return 0;
  } finally {
    await producer.close();
  }
}
