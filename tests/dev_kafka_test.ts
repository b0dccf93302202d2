/**
 * dev/kafka.ts: the development broker's CLI and helpers, against the real
 * broker (started when absent). The stop/start cycle itself is exercised by
 * tests/kafka_test.ts, which also checks that data survives it.
 *
 *   deno test -A tests/dev_kafka_test.ts
 */
import assert from "node:assert/strict";
import { freePort } from "./support/processes.ts";
import { ensureJars } from "../dev/kafka_storage.ts";
import {
  brokerAddress,
  brokerAnswers,
  brokerOptionsFromEnv,
  brokerRunning,
  startBroker,
} from "../dev/kafka.ts";

const SCRIPT = new URL("../dev/kafka_command.ts", import.meta.url).pathname;
const PERMS = ["--allow-run", "--allow-read", "--allow-write", "--allow-env", "--allow-net"];

async function cli(args: string[], env: Record<string, string> = {}) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", ...PERMS, SCRIPT, ...args],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decode = (b: Uint8Array) => new TextDecoder().decode(b).trim();
  return { code: out.code, stdout: decode(out.stdout), stderr: decode(out.stderr) };
}

await startBroker();

Deno.test("dev kafka: start is idempotent and the broker answers clients", async () => {
  const again = await startBroker();
  assert.equal(again.alreadyRunning, true);
  assert.equal(await brokerAnswers(brokerAddress()), true);
});

Deno.test("dev kafka: the CLI reports running with exit 0, and start again says so", async () => {
  const status = await cli(["status"]);
  assert.equal(status.code, 0, status.stderr);
  assert.match(
    status.stdout,
    /^kafka running \((pid \d+|not managed here)\) on 127\.0\.0\.1:\d+$/,
  );
  const start = await cli(["start"]);
  assert.equal(start.code, 0, start.stderr);
  assert.match(start.stdout, /already/);
  // The same pid as the helpers see (when this script started it).
  const pid = await brokerRunning();
  if (pid !== undefined) assert.ok(status.stdout.includes(`pid ${pid}`));
});

Deno.test("dev kafka: a bad variable or command is one line and exit 2", async () => {
  const bad = await cli(["status"], { KAFKA_PORT: "not-a-port" });
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /^config: KAFKA_PORT is invalid: .+$/);
  const usage = await cli(["frobnicate"]);
  assert.equal(usage.code, 2);
  assert.equal(usage.stderr, 'kafka: unknown action "frobnicate"; one of start, stop, status');
  const none = await cli([]);
  assert.equal(none.code, 2);
  assert.equal(none.stderr, "usage: kafka [--secured] start|stop|status (see 'kafka --help')");
});

Deno.test("dev kafka: status of a broker that is not running is 'stopped' with exit 3", async () => {
  const dir = await Deno.makeTempDir({ prefix: "poimen-kafka-" });
  try {
    // A port where nothing listens and an empty directory: no pid file and
    // no broker answering, whatever runs on the default port meanwhile.
    const env = { KAFKA_DIR: dir, KAFKA_PORT: String(freePort()) };
    const status = await cli(["status"], env);
    assert.equal(status.code, 3, status.stdout + status.stderr);
    assert.equal(status.stdout, "kafka stopped");
    // The helpers agree, asked about the same broker.
    const opts = brokerOptionsFromEnv(env);
    assert.equal(await brokerRunning(opts), undefined);
    assert.equal(await brokerAnswers(brokerAddress(opts)), false);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("dev kafka: two brokers' jar copies into one fresh folder at once both succeed and leave one complete copy", async () => {
  const dir = await Deno.makeTempDir({ prefix: "poimen-jars-" });
  const files = { port: 0, controllerPort: 0, dir, libs: `${dir}/libs`, heap: "256m" };
  try {
    await Promise.all([ensureJars(files, () => {}), ensureJars(files, () => {})]);
    const names = [...Deno.readDirSync(dir)].map((e) => e.name);
    assert.deepEqual(names, ["libs"], "no staging folder is left behind");
    const jars = [...Deno.readDirSync(files.libs)].filter((e) => e.name.endsWith(".jar"));
    assert.ok(jars.some((j) => j.name.startsWith("kafka-storage-")), "the classpath is there");
    assert.ok((await Deno.readTextFile(`${files.libs}/.pom-sha256`)).trim().length === 64);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
