/**
 * `deno task dispatch <tenant> '<json>'`: publishes one message to
 * `poimen.<tenant>.dispatch`, as an orchestrator would: the value is the
 * `POST /v1/runs` body, the key `<tenant>/<dispatch_key>` (so every
 * redelivery of one spawn lands on one partition). The body is checked
 * against the schema first; `--raw` publishes it unchecked (to try the
 * relay's dead-lettering). Prints `topic partition offset`.
 */
import { RunRequest } from "../contracts/runs.ts";
import { createProducer } from "../kafka/producer.ts";
import { dispatchMessageKey, dispatchTopic, isTenantId } from "../contracts/topics.ts";
import { readKafkaCliConfig } from "./kafka_config.ts";

const USAGE = "usage: dispatch [--raw] <tenant> '<json body of POST /v1/runs>'";

export async function main(argv: string[]): Promise<number> {
  const raw = argv[0] === "--raw";
  const args = raw ? argv.slice(1) : argv;
  if (args.length !== 2) {
    console.error(USAGE);
    return 64;
  }
  const [tenant, value] = args;
  if (!isTenantId(tenant)) {
    console.error(`dispatch: bad tenant id ${JSON.stringify(tenant)}`);
    return 64;
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
      console.error(`dispatch: ${i.path.join(".") || "body"}: ${i.message}`);
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
