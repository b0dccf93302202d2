/**
 * Every process answers health the same way: `/healthz` (alive) and
 * `/readyz` (its own dependencies answer) — the API on its PORT, worker,
 * outbox and relay on their metrics ports. Real processes, real Postgres,
 * the real broker; an unreachable dependency is a closed port.
 */
import assert from "node:assert/strict";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, freePort, PoimenProcess, runCommand } from "./support/processes.ts";
import { BROKER } from "./support/kafka.ts";

interface Answer {
  status: number;
  body: { status: string; checks?: Record<string, string> };
}

async function get(url: string): Promise<Answer> {
  const res = await fetch(url);
  return { status: res.status, body: await res.json() };
}

/** Waits until `proc` serves its health port, then returns /healthz and /readyz. */
async function health(base: string, proc: PoimenProcess): Promise<[Answer, Answer]> {
  const alive = await waitFor(`${proc.command} serves /healthz`, async () => {
    if (proc.exited) throw new Error(`${proc.command} exited:\n${proc.logs().join("\n")}`);
    return await get(`${base}/healthz`);
  }, 30_000);
  return [alive, await get(`${base}/readyz`)];
}

/** A Postgres URL nothing listens on. */
function deadDatabaseUrl(): string {
  return `postgres://postgres@127.0.0.1:${freePort()}/poimen`;
}

async function stopCleanly(proc: PoimenProcess): Promise<void> {
  const status = await proc.stop();
  assert.equal(status.code, 0, `${proc.command} did not stop cleanly:\n${proc.logs().join("\n")}`);
}

for (const command of ["worker", "outbox"]) {
  Deno.test(`health: the ${command} is alive and ready while Postgres answers`, async () => {
    const db = await freshDatabase();
    const proc = new PoimenProcess(command, {
      DATABASE_URL: db.url,
      KAFKA_BROKERS: BROKER,
      LOG_LEVEL: "warn",
    });
    try {
      const [alive, ready] = await health(proc.metricsUrl!, proc);
      assert.equal(alive.status, 200);
      assert.equal(alive.body.status, "ok");
      assert.equal(ready.status, 200, JSON.stringify(ready.body));
      assert.deepEqual(ready.body, { status: "ready", checks: { postgres: "ok" } });
    } finally {
      await stopCleanly(proc);
      await db.drop();
    }
  });

  Deno.test(`health: the ${command} is alive but not ready while Postgres is unreachable`, async () => {
    const proc = new PoimenProcess(command, {
      DATABASE_URL: deadDatabaseUrl(),
      KAFKA_BROKERS: BROKER,
      LOG_LEVEL: "error",
    });
    try {
      const [alive, ready] = await health(proc.metricsUrl!, proc);
      assert.equal(alive.status, 200);
      assert.equal(ready.status, 503);
      assert.deepEqual(ready.body, { status: "not-ready", checks: { postgres: "unavailable" } });
    } finally {
      await stopCleanly(proc);
    }
  });
}

Deno.test("health: the api is alive and ready on its own port while Postgres answers", async () => {
  const db = await freshDatabase();
  const api = new ApiProcess({ DATABASE_URL: db.url });
  try {
    const [alive, ready] = await health(api.url, api);
    assert.equal(alive.status, 200);
    assert.equal(ready.status, 200);
    assert.deepEqual(ready.body, { status: "ready", checks: { postgres: "ok" } });
  } finally {
    await stopCleanly(api);
    await db.drop();
  }
});

Deno.test("health: the api is alive but not ready while Postgres is unreachable", async () => {
  const api = new ApiProcess({ DATABASE_URL: deadDatabaseUrl(), LOG_LEVEL: "error" });
  try {
    const [alive, ready] = await health(api.url, api);
    assert.equal(alive.status, 200);
    assert.equal(ready.status, 503);
    assert.match(String((ready.body as { type?: string }).type), /database-unavailable$/);
  } finally {
    await stopCleanly(api);
  }
});

/** A relay that consumes nothing of other tests' topics. */
function relay(apiUrl: string, token: string): PoimenProcess {
  const run = crypto.randomUUID().slice(0, 8);
  return new PoimenProcess("relay", {
    KAFKA_BROKERS: BROKER,
    API_URL: apiUrl,
    RELAY_TOKEN: token,
    RELAY_GROUP_ID: `poimen-test-health-${run}`,
    RELAY_TENANT_PATTERN: `health-${run}`,
    LOG_LEVEL: "error",
  });
}

Deno.test({
  name:
    "health: the relay is ready while the broker and the API answer, and not while the API is away",
  fn: async () => {
    const db = await freshDatabase();
    const api = new ApiProcess({ DATABASE_URL: db.url });
    const relays: PoimenProcess[] = [];
    try {
      await api.ready();
      const token = await runCommand("token", ["--service", "relay"], {
        DATABASE_URL: db.url,
        LOG_LEVEL: "warn",
      });
      assert.equal(token.code, 0, token.stderr);

      const up = relay(api.url, token.stdout.trim());
      relays.push(up);
      const [alive, ready] = await health(up.metricsUrl!, up);
      assert.equal(alive.status, 200);
      assert.equal(ready.status, 200, JSON.stringify(ready.body));
      assert.deepEqual(ready.body, { status: "ready", checks: { kafka: "ok", api: "ok" } });

      const apiAway = relay(`http://127.0.0.1:${freePort()}`, token.stdout.trim());
      relays.push(apiAway);
      const [stillAlive, notReady] = await health(apiAway.metricsUrl!, apiAway);
      assert.equal(stillAlive.status, 200);
      assert.equal(notReady.status, 503);
      assert.deepEqual(notReady.body, {
        status: "not-ready",
        checks: { kafka: "ok", api: "unavailable" },
      });
    } finally {
      for (const r of relays) await stopCleanly(r);
      await stopCleanly(api);
      await db.drop();
    }
  },
});

Deno.test("health: the relay is not ready while the broker is unreachable", async () => {
  const db = await freshDatabase();
  const api = new ApiProcess({ DATABASE_URL: db.url });
  const run = crypto.randomUUID().slice(0, 8);
  const proc = new PoimenProcess("relay", {
    KAFKA_BROKERS: `127.0.0.1:${freePort()}`,
    API_URL: api.url,
    RELAY_TOKEN: "pmn_not_used_here",
    RELAY_GROUP_ID: `poimen-test-health-${run}`,
    LOG_LEVEL: "error",
  });
  try {
    await api.ready();
    const [alive, ready] = await health(proc.metricsUrl!, proc);
    assert.equal(alive.status, 200);
    assert.equal(ready.status, 503);
    assert.equal(ready.body.checks?.api, "ok");
    assert.notEqual(ready.body.checks?.kafka, "ok");
  } finally {
    await proc.stop();
    await stopCleanly(api);
    await db.drop();
  }
});
