/**
 * The development broker's files (dev/kafka.ts): its jars, copied from
 * Maven Central once per pom (dev/kafka/pom.xml), its JVM's command line,
 * and its storage, formatted on the first start only.
 */
import { SECOND } from "../core/time.ts";
import { scramFormatArgs, type SecuredMaterial } from "./kafka_secured.ts";

const ROOT = decodeURIComponent(new URL("..", import.meta.url).pathname).replace(/\/$/, "");
const POM = `${ROOT}/dev/kafka/pom.xml`;
const LOG4J = `${ROOT}/dev/kafka/log4j2.xml`;

/** What of the broker's options these need. */
export interface BrokerFiles {
  port: number;
  controllerPort: number;
  dir: string;
  libs: string;
  heap: string;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

/** Runs `cmd`; throws with the tail of its output when it fails. */
export async function run(cmd: string, args: string[], what: string): Promise<string> {
  let out: Deno.CommandOutput;
  try {
    out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) {
      throw new Error(`${what}: '${cmd}' is not installed`);
    }
    throw error;
  }
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  if (!out.success) {
    const tail = text.trim().split("\n").slice(-20).join("\n");
    throw new Error(`${what} failed (exit ${out.code})${tail ? `:\n${tail}` : ""}`);
  }
  return text;
}

async function sha256(text: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Copies the jars of dev/kafka/pom.xml into `opts.libs` unless they are there. */
export async function ensureJars(opts: BrokerFiles, report: (line: string) => void): Promise<void> {
  const libs = opts.libs;
  const marker = `${libs}/.pom-sha256`;
  // The marker is written last, so its presence means a complete copy of this pom's classpath.
  const want = await sha256(await Deno.readTextFile(POM));
  const have = await Deno.readTextFile(marker).catch(() => "");
  if (have.trim() === want) return;
  report(`downloading Kafka jars from Maven Central into ${libs}`);
  const started = performance.now();
  // Copied into a folder of this call's own, then renamed into place: test
  // files starting brokers at once in a fresh checkout each copy, and two
  // copies into one folder were seen to fail each other ("Failed to copy
  // full contents"). The first complete copy wins; the others are dropped.
  const staging = `${libs}.${crypto.randomUUID().slice(0, 8)}.partial`;
  try {
    await run("mvn", [
      "-q",
      "-B",
      "-f",
      POM,
      "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
      "-DincludeScope=runtime",
      `-DoutputDirectory=${staging}`,
    ], "mvn copy-dependencies");
    await Deno.writeTextFile(`${staging}/.pom-sha256`, want + "\n");
    if ((await Deno.readTextFile(marker).catch(() => "")).trim() !== want) {
      await Deno.remove(libs, { recursive: true }).catch(() => {});
      await Deno.rename(staging, libs).catch(async (error) => {
        // Another copy took the place meanwhile: fine if it is complete.
        if ((await Deno.readTextFile(marker).catch(() => "")).trim() !== want) throw error;
      });
    }
  } finally {
    await Deno.remove(staging, { recursive: true }).catch(() => {});
  }
  report(`jars ready in ${((performance.now() - started) / SECOND).toFixed(1)} s`);
}

function randomClusterId(): string {
  // Kafka's Uuid.randomUuid: 16 random bytes, base64url without padding,
  // never starting with '-' (it would read as a command-line option).
  while (true) {
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    const id = btoa(String.fromCharCode(...bytes)).replaceAll("+", "-").replaceAll("/", "_")
      .replace(/=+$/, "");
    if (!id.startsWith("-")) return id;
  }
}

/** The JVM's arguments to run `main` of the broker's classpath. */
export function javaArgs(opts: BrokerFiles, main: string, args: string[]): string[] {
  return [
    `-Xmx${opts.heap}`,
    "-Xms256m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-Djava.awt.headless=true",
    `-Dlog4j2.configurationFile=${LOG4J}`,
    `-Dkafka.logs.dir=${opts.dir}`,
    "-cp",
    `${opts.libs}/*`,
    main,
    ...args,
  ];
}

interface FormatRecord {
  port: number;
  controllerPort: number;
}

/** Formats the storage of `opts.dir` unless it is (with the SCRAM users of `material`). */
export async function ensureFormatted(
  opts: BrokerFiles,
  report: (line: string) => void,
  material?: SecuredMaterial,
) {
  const data = `${opts.dir}/data`;
  const record = `${opts.dir}/format.json`;
  if (await exists(`${data}/meta.properties`)) {
    // The controller's own endpoint is written into the quorum state at format time.
    const formatted = JSON.parse(await Deno.readTextFile(record).catch(() => "null")) as
      | FormatRecord
      | null;
    if (formatted && formatted.controllerPort !== opts.controllerPort) {
      throw new Error(
        `storage in ${data} was formatted for controller port ${formatted.controllerPort}, ` +
          `not ${opts.controllerPort}: set KAFKA_CONTROLLER_PORT=${formatted.controllerPort} ` +
          `or remove ${data}`,
      );
    }
    return;
  }
  report(`formatting storage in ${data}`);
  await Deno.mkdir(data, { recursive: true });
  await run(
    "java",
    javaArgs(opts, "kafka.tools.StorageTool", [
      "format",
      "--standalone",
      "--ignore-formatted",
      "-t",
      randomClusterId(),
      "-c",
      `${opts.dir}/server.properties`,
      ...material ? scramFormatArgs(material) : [],
    ]),
    "kafka storage format",
  );
  const rec: FormatRecord = { port: opts.port, controllerPort: opts.controllerPort };
  await Deno.writeTextFile(record, JSON.stringify(rec) + "\n");
}
