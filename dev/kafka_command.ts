/**
 * `deno task kafka start|stop|status`: the command line of the local
 * development broker (dev/kafka.ts).
 */
import { ConfigError } from "../core/errors.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";
import {
  brokerAddress,
  brokerAnswers,
  type BrokerOptions,
  brokerOptionsFromEnv,
  brokerRunning,
  kafkaDevEnv,
  startBroker,
  stopBroker,
} from "./kafka.ts";
import {
  ensureSecuredMaterial,
  securedClientSecurity,
  securedProcessEnv,
} from "./kafka_secured.ts";

const COMMAND = {
  name: "kafka",
  synopsis: "[--secured] start|stop|status",
  description: `
The local single-node Apache Kafka (KRaft) for development and tests, assembled
from Maven Central jars (no Docker). start: brings it up (the first start
downloads the jars into <KAFKA_DIR>/libs) and waits until it answers; stop:
stops it; status: exit 0 when a broker answers on KAFKA_PORT, 3 when none does.
--secured: the secured broker instead (in <KAFKA_DIR>/secured): SASL_SSL with
SCRAM and PLAIN on KAFKA_SECURED_PORT, SSL with client certificates on
KAFKA_SECURED_SSL_PORT; start prints the variables its clients need.`,
  flags: {
    secured: {
      type: "boolean",
      description: "the secured broker (SASL_SSL, mTLS) in <KAFKA_DIR>/secured",
    },
  },
  positionals: { min: 1, max: 1 },
  env: kafkaDevEnv,
} satisfies CommandSpec;

async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const command = line.positionals[0];
  if (!["start", "stop", "status"].includes(command)) {
    return usageError(
      COMMAND,
      `unknown action ${JSON.stringify(command)}; one of start, stop, status`,
    );
  }
  const say = (line: string) => console.log(line);
  let opts: BrokerOptions;
  try {
    opts = { ...brokerOptionsFromEnv(Deno.env.toObject(), line.flags.secured), report: say };
  } catch (error) {
    if (error instanceof ConfigError) {
      console.error(error.message);
      return 2;
    }
    throw error;
  }
  switch (command) {
    case "start":
      await startBroker(opts);
      if (opts.secured) {
        const m = await ensureSecuredMaterial(opts.dir);
        say("its clients' variables (SASL_SSL, SCRAM-SHA-512; mTLS clients see docs/kafka.md):");
        for (const [k, v] of Object.entries(securedProcessEnv(brokerAddress(opts), m))) {
          say(`  ${k}=${v}`);
        }
      }
      return 0;
    case "stop":
      await stopBroker(opts);
      return 0;
    case "status": {
      const pid = await brokerRunning(opts);
      if (pid !== undefined) {
        say(`kafka running (pid ${pid}) on ${brokerAddress(opts)}`);
        return 0;
      }
      // A broker this script did not start (compose, another checkout) still
      // serves clients: report it as running, but not ours to stop.
      const security = opts.secured
        ? securedClientSecurity(await ensureSecuredMaterial(opts.dir))
        : undefined;
      if (await brokerAnswers(brokerAddress(opts), undefined, security)) {
        say(`kafka running (not managed here) on ${brokerAddress(opts)}`);
        return 0;
      }
      say("kafka stopped");
      return 3;
    }
  }
  return 2;
}

if (import.meta.main) {
  try {
    Deno.exit(await main(Deno.args));
  } catch (error) {
    console.error(`kafka: ${error instanceof Error ? error.message : String(error)}`);
    Deno.exit(1);
  }
}
