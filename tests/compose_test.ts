/**
 * compose.yaml and the Dockerfile, checked without a Docker engine (our
 * machines have none): Debian's `docker-compose` (1.29) parses, validates
 * and interpolates the file, and these tests hold what it resolves to
 * against the code — every `deno task` it runs exists, every variable it sets
 * is one the process reads, every long-running service has a health check on
 * its own (published, 0.0.0.0-bound) port, and no metrics port is published
 * beyond the host's loopback.
 */
import assert from "node:assert/strict";
import { parse } from "yaml";
import type { z } from "zod";
import { ApiEnv } from "../api/config.ts";
import { workerEnvSchema } from "../worker/config.ts";
import { outboxEnvSchema } from "../outbox/config.ts";
import { relayEnvSchema } from "../relay/config.ts";
import { InitEnv } from "../cli/init.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";

interface Service {
  image?: string;
  build?: unknown;
  command?: string[] | string;
  environment?: Record<string, string | number | null>;
  healthcheck?: { test: string[] | string };
  ports?: ({ published: number | string; target: number | string } | string)[];
  volumes?: (string | { type?: string; source?: string; target: string })[];
  depends_on?: Record<string, { condition: string }> | string[];
  restart?: string;
}
interface Compose {
  services: Record<string, Service>;
  volumes?: Record<string, unknown>;
}

/** The environment each poimen process reads, by the task that starts it. */
const SCHEMAS: Record<string, z.ZodObject> = {
  api: ApiEnv,
  worker: workerEnvSchema,
  outbox: outboxEnvSchema,
  relay: relayEnvSchema,
  init: InitEnv,
};

/** The variable holding the port each process serves /readyz on, and the one holding its bind address. */
const HEALTH_PORT: Record<string, [port: string, host: string]> = {
  api: ["PORT", "HOST"],
  worker: ["WORKER_METRICS_PORT", "WORKER_METRICS_HOST"],
  outbox: ["OUTBOX_METRICS_PORT", "OUTBOX_METRICS_HOST"],
  relay: ["RELAY_METRICS_PORT", "RELAY_METRICS_HOST"],
};

/** The variables holding each process's metrics listener (whose /metrics names tenants). */
const METRICS_PORT: Record<string, [port: string, host: string]> = {
  api: ["API_METRICS_PORT", "API_METRICS_HOST"],
  worker: ["WORKER_METRICS_PORT", "WORKER_METRICS_HOST"],
  outbox: ["OUTBOX_METRICS_PORT", "OUTBOX_METRICS_HOST"],
  relay: ["RELAY_METRICS_PORT", "RELAY_METRICS_HOST"],
};

/** A published port as docker-compose resolves it: long form, or `[ip:]published:target[/proto]`. */
interface Published {
  /** The host address it is bound to; "" for all interfaces. */
  ip: string;
  target: string;
}

function publishedPorts(service: Service): Published[] {
  return (service.ports ?? []).map((p) => {
    if (typeof p !== "string") {
      const ip = (p as { host_ip?: string }).host_ip ?? "";
      return { ip: ip === "0.0.0.0" ? "" : ip, target: String(p.target) };
    }
    const parts = p.replace(/\/\w+$/, "").split(":");
    const ip = parts.length === 3 ? parts[0] : "";
    return { ip: ip === "0.0.0.0" ? "" : ip, target: parts.at(-1)! };
  });
}

async function dockerCompose(): Promise<string | undefined> {
  try {
    const out = await new Deno.Command("docker-compose", { args: ["version", "--short"] })
      .output();
    return new TextDecoder().decode(out.stdout).trim();
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return undefined;
    throw err;
  }
}

const version = await dockerCompose();
const SKIP = version === undefined
  ? " (SKIPPED: docker-compose is not installed; `apt-get install docker-compose`, as .ci/run does)"
  : "";

/** compose.yaml as docker-compose resolves it (defaults of ${…} filled in). */
async function resolved(): Promise<Compose> {
  const out = await new Deno.Command("docker-compose", {
    args: ["-f", "compose.yaml", "config"],
    cwd: PROJECT_ROOT,
    // Only the defaults written in the file: nothing from the caller's shell or .env.
    env: { PATH: Deno.env.get("PATH") ?? "/usr/bin:/bin" },
    clearEnv: true,
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, `docker-compose ${version} refuses compose.yaml:\n${stderr}`);
  return parse(new TextDecoder().decode(out.stdout)) as Compose;
}

const deno = JSON.parse(await Deno.readTextFile(`${PROJECT_ROOT}/deno.json`));
const dockerfile = await Deno.readTextFile(`${PROJECT_ROOT}/Dockerfile`);

/** The poimen services: those built from the Dockerfile. */
function poimen(compose: Compose): [string, Service][] {
  const built = Object.entries(compose.services).filter(([, s]) => s.build !== undefined);
  assert.deepEqual(built.map(([name]) => name).sort(), [
    "api",
    "init",
    "outbox",
    "relay",
    "worker",
  ]);
  return built;
}

/** The command as the container runs it (`config` prints `$` escaped as `$$`). */
function commandLine(service: Service): string {
  const line = Array.isArray(service.command) ? service.command.join(" ") : service.command ?? "";
  return line.replaceAll("$$", "$");
}

/** The `deno task` names a command line runs. */
function tasksIn(line: string): string[] {
  return [...line.matchAll(/\bdeno task (?:-q )?([\w-]+)/g)].map((m) => m[1]);
}

function testLine(service: Service): string {
  const t = service.healthcheck?.test;
  return Array.isArray(t) ? t.join(" ") : t ?? "";
}

Deno.test({
  name: `compose: docker-compose${version ? ` ${version}` : ""} accepts compose.yaml${SKIP}`,
  ignore: version === undefined,
  fn: async () => {
    const compose = await resolved();
    assert.deepEqual(
      Object.keys(compose.services).sort(),
      ["api", "init", "kafka", "outbox", "postgres", "relay", "worker"],
    );
  },
});

Deno.test({
  name: `compose: every deno task compose.yaml and the Dockerfile run exists in deno.json${SKIP}`,
  ignore: version === undefined,
  fn: async () => {
    const compose = await resolved();
    const run = poimen(compose).map(([name, s]) => {
      const tasks = tasksIn(commandLine(s));
      assert.equal(tasks.length, 1, `${name} runs one deno task: ${commandLine(s)}`);
      return tasks[0];
    });
    // CMD ["task", "api"]: the image's entrypoint puts `deno` in front.
    const cmd = /^CMD (\[.*\])$/m.exec(dockerfile);
    assert.ok(cmd, "the Dockerfile has a JSON-form CMD");
    run.push(...tasksIn(`deno ${JSON.parse(cmd[1]).join(" ")}`));
    run.push(...tasksIn(dockerfile));
    assert.ok(run.length >= 6);
    for (const task of run) assert.ok(deno.tasks[task], `deno.json has no task ${task}`);
  },
});

Deno.test({
  name:
    `compose: every variable compose.yaml sets on a poimen service is one its process reads${SKIP}`,
  ignore: version === undefined,
  fn: async () => {
    const compose = await resolved();
    for (const [name, service] of poimen(compose)) {
      const [task] = tasksIn(commandLine(service));
      const schema = SCHEMAS[task];
      assert.ok(schema, `no schema known for task ${task}`);
      for (const variable of Object.keys(service.environment ?? {})) {
        assert.ok(variable in schema.shape, `${name} sets ${variable}, which ${task} never reads`);
      }
      // Variables a command line sets for the process count too (the relay's token).
      for (const m of commandLine(service).matchAll(/\b([A-Z][A-Z0-9_]+)=/g)) {
        assert.ok(m[1] in schema.shape, `${name} sets ${m[1]}, which ${task} never reads`);
      }
    }
  },
});

Deno.test({
  name:
    `compose: every long-running service has a health check, poimen's on /readyz of its own published 0.0.0.0 port${SKIP}`,
  ignore: version === undefined,
  fn: async () => {
    const compose = await resolved();
    for (const [name, service] of Object.entries(compose.services)) {
      // A one-shot job's health is its exit code, which service_completed_successfully reads.
      if (service.restart === "no") continue;
      assert.ok(service.healthcheck?.test, `${name} has no health check`);
    }
    for (const [name, service] of poimen(compose)) {
      const [task] = tasksIn(commandLine(service));
      if (!HEALTH_PORT[task]) continue;
      const [portVar, hostVar] = HEALTH_PORT[task];
      const env = service.environment ?? {};
      const port = String(env[portVar]);
      assert.match(port, /^\d+$/, `${name} sets ${portVar}`);
      assert.equal(env[hostVar], "0.0.0.0", `${name} binds ${hostVar} to 0.0.0.0`);
      assert.ok(
        testLine(service).includes(`http://127.0.0.1:${port}/readyz`),
        `${name}'s health check asks its own /readyz: ${testLine(service)}`,
      );
      const published = publishedPorts(service).map((p) => p.target);
      assert.ok(published.includes(port), `${name} publishes port ${port}: ${published}`);
    }
  },
});

Deno.test({
  name:
    `compose: every metrics listener is published on the host's loopback only, never on all interfaces${SKIP}`,
  ignore: version === undefined,
  fn: async () => {
    const compose = await resolved();
    for (const [name, service] of poimen(compose)) {
      const [task] = tasksIn(commandLine(service));
      if (!METRICS_PORT[task]) continue;
      const [portVar, hostVar] = METRICS_PORT[task];
      const env = service.environment ?? {};
      const port = String(env[portVar]);
      assert.match(port, /^\d+$/, `${name} sets ${portVar}`);
      // Reachable by a Prometheus in the compose network, not from outside the host.
      assert.equal(env[hostVar], "0.0.0.0", `${name} binds ${hostVar} to 0.0.0.0`);
      const bound = publishedPorts(service).filter((p) => p.target === port);
      assert.ok(bound.length > 0, `${name} publishes its metrics port ${port}`);
      for (const p of bound) {
        assert.equal(p.ip, "127.0.0.1", `${name} publishes ${port} on all interfaces`);
      }
    }
    // Whatever else is published on all interfaces is the API's own port.
    for (const [name, service] of Object.entries(compose.services)) {
      for (const p of publishedPorts(service).filter((p) => p.ip === "")) {
        assert.deepEqual([name, p.target], ["api", "8080"], `${name} publishes ${p.target}`);
      }
    }
  },
});

Deno.test({
  name: `compose: api and worker do not wait for Kafka, and nothing mounts the checkout${SKIP}`,
  ignore: version === undefined,
  fn: async () => {
    const compose = await resolved();
    for (const name of ["api", "worker"]) {
      const deps = compose.services[name].depends_on ?? {};
      const names = Array.isArray(deps) ? deps : Object.keys(deps);
      assert.ok(!names.includes("kafka"), `${name} depends on kafka`);
      assert.ok(names.includes("init"), `${name} waits for init`);
    }
    const named = new Set(Object.keys(compose.volumes ?? {}));
    for (const [name, service] of Object.entries(compose.services)) {
      for (const v of service.volumes ?? []) {
        const source = typeof v === "string" ? v.split(":")[0] : v.source ?? "";
        assert.ok(named.has(source), `${name} mounts ${source}, not a named volume`);
      }
    }
  },
});

Deno.test({
  name: `compose: init declares POIMEN_TENANTS' topics and keeps the token the relay reads${SKIP}`,
  ignore: version === undefined,
  fn: async () => {
    const compose = await resolved();
    const init = compose.services.init.environment ?? {};
    assert.equal(init.POIMEN_TENANTS, "demo", "a default tenant, so a bare `up` can dispatch");
    const file = String(init.RELAY_TOKEN_FILE);
    const dir = file.slice(0, file.lastIndexOf("/"));
    // The init task may write there, and the relay reads the same file from the same volume.
    assert.match(deno.tasks.init, new RegExp(`--allow-write=${dir}\\b`));
    const relay = compose.services.relay;
    assert.ok(commandLine(relay).includes(`RELAY_TOKEN="$(cat ${file})"`), commandLine(relay));
    const volumeAt = (s: Service) =>
      (s.volumes ?? []).map(String).find((v) => v.split(":")[1] === dir)?.split(":")[0];
    assert.ok(volumeAt(compose.services.init), "init mounts a volume at the token's directory");
    assert.equal(volumeAt(relay), volumeAt(compose.services.init));
    assert.ok(relay.depends_on && "init" in relay.depends_on, "the relay waits for init");
  },
});

Deno.test("compose: the image is denoland/deno 2.9.6, installs its dependencies and runs as a non-root user", () => {
  assert.match(dockerfile, /^FROM denoland\/deno:2\.9\.6$/m);
  assert.match(dockerfile, /^RUN deno install --frozen$/m);
  const users = [...dockerfile.matchAll(/^USER (\S+)$/gm)].map((m) => m[1]);
  assert.ok(users.length > 0 && !["root", "0"].includes(users.at(-1)!), `USER ${users}`);
  const ignored = Deno.readTextFileSync(`${PROJECT_ROOT}/.dockerignore`);
  for (const path of ["node_modules", ".kafka", ".git", ".env"]) {
    assert.match(ignored, new RegExp(`^${path.replace(".", "\\.")}$`, "m"), path);
  }
});
