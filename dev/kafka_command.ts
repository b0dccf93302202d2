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

const COMMAND = {
  name: "kafka",
  synopsis: "start|stop|status",
  description: `
The local single-node Apache Kafka (KRaft) for development and tests, assembled
from Maven Central jars (no Docker). start: brings it up (the first start
downloads the jars into <KAFKA_DIR>/libs) and waits until it answers; stop:
stops it; status: exit 0 when a broker answers on KAFKA_PORT, 3 when none does.`,
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
    opts = { ...brokerOptionsFromEnv(), report: say };
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
      if (await brokerAnswers(brokerAddress(opts))) {
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
