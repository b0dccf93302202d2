/**
 * No task stops at a Deno permission prompt in a real terminal. Each task is
 * run as a person would type it (`deno task <name> …`) under a pseudo-terminal
 * and must get where it is going — a one-shot command exits 0, a process
 * answers /readyz, `up` prints that poimen is up — with no prompt on the
 * screen. Through a pipe Deno denies silently, so only a TTY shows a prompt.
 */
import assert from "node:assert/strict";
import { freshDatabase } from "./support/db.ts";
import { BROKER } from "./support/kafka.ts";
import { freePort, runCommand } from "./support/processes.ts";
import { PtyTask } from "./support/pty.ts";

const DEADLINE_MS = 60_000;

/** Polls until `reached()` holds; fails at once if the terminal shows a prompt. */
async function reach(task: PtyTask, what: string, reached: () => Promise<boolean> | boolean) {
  const deadline = Date.now() + DEADLINE_MS;
  while (Date.now() < deadline) {
    if (task.prompted()) {
      await task.stop("SIGKILL");
      assert.fail(`deno task ${task.task} stopped at a permission prompt:\n${task.output}`);
    }
    if (await reached()) return;
    if (task.exited && !(await reached())) {
      assert.fail(`deno task ${task.task} exited before ${what}:\n${task.output}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  await task.stop("SIGKILL");
  assert.fail(`deno task ${task.task}: not ${what} within ${DEADLINE_MS} ms:\n${task.output}`);
}

async function ok(url: string): Promise<boolean> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(2_000) });
    await res.body?.cancel();
    return res.ok;
  } catch {
    return false;
  }
}

/** Runs a one-shot task to its end under a terminal; returns what it showed. */
async function finish(task: string, args: string[], env: Record<string, string>) {
  const t = new PtyTask(task, args, env);
  await reach(t, "finished", () => t.exited);
  const status = await t.status();
  assert.equal(status.code, 0, `deno task ${task} failed:\n${t.output}`);
  assert.equal(t.prompted(), false, t.output);
  return t.output;
}

Deno.test("tasks: token, tenant, topics, dispatch and dlq finish in a terminal without a permission prompt", async () => {
  const db = await freshDatabase();
  const tenant = `pty-${crypto.randomUUID().slice(0, 8)}`;
  const env = { DATABASE_URL: db.url, KAFKA_BROKERS: BROKER };
  try {
    const token = await finish("token", [tenant], env);
    assert.match(token, /[A-Za-z0-9_-]{20,}/);
    assert.match(await finish("tenant", [tenant, "--max-queued", "5"], env), /max-queued 5/);
    await finish("topics", [tenant], env);
    const sent = await finish("dispatch", [
      tenant,
      JSON.stringify({ workflow_ref: "echo", input: {}, dispatch_key: "pty" }),
    ], env);
    assert.match(sent, new RegExp(`poimen\\.${tenant}\\.dispatch \\d+ \\d+`));
    await finish("dlq", [tenant], env);
  } finally {
    await db.drop();
  }
});

Deno.test("tasks: workflow list and promote finish in a terminal without a permission prompt", async () => {
  const db = await freshDatabase();
  const env = { DATABASE_URL: db.url };
  try {
    assert.match(await finish("workflow", ["list"], env), /echo +1 +current/);
    assert.match(
      await finish("workflow", ["promote", "echo@1"], env),
      /echo@1 was current already/,
    );
  } finally {
    await db.drop();
  }
});

Deno.test("tasks: schedule create, list, pause, resume, backfill and delete finish in a terminal without a permission prompt", async () => {
  const db = await freshDatabase();
  const env = { DATABASE_URL: db.url };
  try {
    await db.sql`insert into tenants (tenant_id) values ('pty-sched')`;
    const created = await finish("schedule", [
      "pty-sched",
      "create",
      "nightly",
      "--workflow",
      "echo",
      "--cron",
      "30 2 * * *",
      "--timezone",
      "Europe/Paris",
    ], env);
    assert.match(created, /nightly echo "30 2 \* \* \*" Europe\/Paris .*\(created\)/);
    assert.match(await finish("schedule", ["pty-sched", "list"], env), /nightly echo/);
    assert.match(await finish("schedule", ["pty-sched", "pause", "nightly"], env), /paused/);
    assert.match(await finish("schedule", ["pty-sched", "resume", "nightly"], env), /next 20/);
    const range = ["--from", "2026-03-28T00:00:00Z", "--to", "2026-03-30T12:00:00Z"];
    const first = await finish("schedule", ["pty-sched", "backfill", "nightly", ...range], env);
    assert.match(first, /2026-03-29T01:00:00.000Z \S+ created/);
    const again = await finish("schedule", ["pty-sched", "backfill", "nightly", ...range], env);
    assert.match(again, /2026-03-29T01:00:00.000Z \S+ existed/);
    assert.match(await finish("schedule", ["pty-sched", "delete", "nightly"], env), /deleted/);
  } finally {
    await db.drop();
  }
});

Deno.test("tasks: api, worker, outbox and relay become ready in a terminal without a permission prompt", async () => {
  const db = await freshDatabase();
  const tenant = `pty-${crypto.randomUUID().slice(0, 8)}`;
  const base = { DATABASE_URL: db.url, KAFKA_BROKERS: BROKER };
  const relayToken = await runCommand("token", ["--service", "relay"], base);
  assert.equal(relayToken.code, 0, relayToken.stderr);
  const topics = await runCommand("topics", [tenant], base);
  assert.equal(topics.code, 0, topics.stderr);
  const api = `http://127.0.0.1:${freePort()}`;
  const ports = { worker: freePort(), outbox: freePort(), relay: freePort() };
  const started: PtyTask[] = [];
  try {
    const apiTask = new PtyTask("api", [], {
      ...base,
      PORT: new URL(api).port,
      API_METRICS_PORT: String(freePort()),
    });
    started.push(apiTask);
    await reach(apiTask, "ready", () => ok(`${api}/readyz`));
    const processes: [string, Record<string, string>][] = [
      ["worker", { ...base, WORKER_METRICS_PORT: String(ports.worker) }],
      ["outbox", { ...base, OUTBOX_METRICS_PORT: String(ports.outbox) }],
      ["relay", {
        KAFKA_BROKERS: BROKER,
        API_URL: api,
        RELAY_TOKEN: relayToken.stdout.trim(),
        RELAY_TENANT_PATTERN: tenant,
        RELAY_GROUP_ID: `pty-${tenant}`,
        RELAY_METRICS_PORT: String(ports.relay),
      }],
    ];
    for (const [name, env] of processes) {
      const t = new PtyTask(name, [], env);
      started.push(t);
      const port = ports[name as keyof typeof ports];
      await reach(t, "ready", () => ok(`http://127.0.0.1:${port}/readyz`));
    }
    for (const t of started.reverse()) {
      const status = await t.stop();
      assert.equal(t.prompted(), false, t.output);
      assert.equal(status.code, 0, `deno task ${t.task} did not stop cleanly:\n${t.output}`);
    }
  } finally {
    for (const t of started) await t.stop("SIGKILL");
    await db.drop();
  }
});

Deno.test("tasks: up brings the system up in a terminal without a permission prompt", async () => {
  const db = await freshDatabase(false);
  const port = freePort();
  const up = new PtyTask("up", [], {
    DATABASE_URL: db.url,
    KAFKA_BROKERS: BROKER,
    PORT: String(port),
    API_METRICS_PORT: String(freePort()),
    WORKER_METRICS_PORT: String(freePort()),
    OUTBOX_METRICS_PORT: String(freePort()),
    RELAY_METRICS_PORT: String(freePort()),
    DEV_TENANT: `pty-${crypto.randomUUID().slice(0, 8)}`,
  });
  try {
    await reach(up, "up", () => up.output.includes("poimen is up"));
    assert.equal(await ok(`http://127.0.0.1:${port}/readyz`), true, up.output);
    const status = await up.stop("SIGINT");
    assert.equal(up.prompted(), false, up.output);
    assert.equal(status.code, 0, `deno task up did not stop cleanly:\n${up.output}`);
  } finally {
    await up.stop("SIGKILL");
    await db.drop();
  }
});
