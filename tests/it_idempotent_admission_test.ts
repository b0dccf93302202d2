/**
 * Idempotent admission against a real API process and a real Postgres: the
 * same (tenant, dispatch_key) makes exactly one run, sequentially,
 * concurrently and against a transaction holding the key; no key means no
 * dedup.
 */
import assert from "node:assert/strict";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, runCommand } from "./support/processes.ts";

interface Posted {
  status: number;
  headers: Headers;
  body: { run_id: string; [k: string]: unknown };
}

async function post(
  api: ApiProcess,
  token: string,
  body: unknown,
  client?: Deno.HttpClient,
): Promise<Posted> {
  const res = await fetch(`${api.url}/v1/runs`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
    client,
  });
  return { status: res.status, headers: res.headers, body: await res.json() };
}

async function newTenant(db: TestDatabase, prefix: string): Promise<[string, string]> {
  const tenant = `${prefix}-${crypto.randomUUID().slice(0, 8)}`;
  const out = await runCommand("token", [tenant], { DATABASE_URL: db.url, LOG_LEVEL: "warn" });
  assert.equal(out.code, 0, out.stderr);
  const token = out.stdout.trim();
  assert.match(token, /^pmn_[A-Za-z0-9_-]{43}$/);
  return [tenant, token];
}

async function countRuns(db: TestDatabase, tenant: string, key?: string): Promise<number> {
  const [r] = key === undefined
    ? await db.sql`select count(*)::int as n from runs where tenant_id = ${tenant}`
    : await db.sql`select count(*)::int as n from runs
                    where tenant_id = ${tenant} and dispatch_key = ${key}`;
  return r.n;
}

/** Runs `fn` with a database and an API process on it, both torn down after. */
function withApi(
  name: string,
  env: Record<string, string>,
  fn: (db: TestDatabase, api: ApiProcess) => Promise<void>,
) {
  Deno.test(name, async () => {
    const db = await freshDatabase();
    const api = new ApiProcess({ DATABASE_URL: db.url, ...env });
    try {
      await api.ready();
      await fn(db, api);
    } finally {
      const status = await api.stop();
      await db.drop();
      assert.equal(status.code, 0, `api did not stop cleanly:\n${api.logs().join("\n")}`);
    }
  });
}

withApi(
  "idempotent_admission: a key admits once; repeats replay that run (flagging a different body), without a key each call is a new run",
  {},
  async (db, api) => {
    const [tenant, token] = await newTenant(db, "replay");
    const K = `key-${crypto.randomUUID()}`;

    // Spawn with K: one run, R.
    const first = await post(api, token, {
      workflow_ref: "echo",
      input: { n: 1 },
      dispatch_key: K,
    });
    assert.equal(first.status, 201);
    assert.equal(first.headers.get("location"), `/v1/runs/${first.body.run_id}`);
    assert.equal(first.headers.get("idempotent-replayed"), null);
    assert.equal(await countRuns(db, tenant, K), 1);
    const R = first.body.run_id;

    // Again with K: no new run, the same id, marked as a replay.
    const second = await post(api, token, {
      workflow_ref: "echo",
      input: { n: 1 },
      dispatch_key: K,
    });
    assert.equal(second.status, 200);
    assert.equal(second.body.run_id, R);
    assert.equal(second.headers.get("idempotent-replayed"), "true");
    assert.equal(second.headers.get("idempotent-body-mismatch"), null);
    assert.equal(await countRuns(db, tenant, K), 1);

    // A replay with another body still gets R, but says the bodies differ.
    const before = await api.metric("poimen_admission_replay_body_mismatch_total");
    const third = await post(api, token, {
      workflow_ref: "echo",
      input: { n: 2 },
      dispatch_key: K,
    });
    assert.equal(third.status, 200);
    assert.equal(third.body.run_id, R);
    assert.equal(third.headers.get("idempotent-body-mismatch"), "true");
    assert.equal(await api.metric("poimen_admission_replay_body_mismatch_total"), before + 1);

    // The deduplicated admissions wrote nothing: one run.admitted event.
    const events = await db.sql`select type, seq from work_events where run_id = ${R}`;
    assert.deepEqual(events.map((e) => [e.type, e.seq]), [["run.admitted", 1]]);

    // No key, twice: two distinct runs.
    const a = await post(api, token, { workflow_ref: "echo", input: { n: 1 } });
    const b = await post(api, token, { workflow_ref: "echo", input: { n: 1 } });
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.notEqual(a.body.run_id, b.body.run_id);
    assert.equal(await countRuns(db, tenant), 3);

    assert.equal(await api.metric("poimen_admissions_total", { outcome: "created" }), 3);
    assert.equal(await api.metric("poimen_admissions_total", { outcome: "deduplicated" }), 2);
  },
);

// Twenty concurrent callers, each on its own TCP connection. Once with
// group commit (the 20 may share a statement), once with one statement per
// admission on 20 pooled connections, so the unique index itself must catch
// the race between transactions.
for (
  const [label, env] of [
    ["group commit", {}],
    ["one statement each", {
      ADMISSION_MAX_BATCH: "1",
      ADMISSION_MAX_CONCURRENT: "20",
      DATABASE_POOL_SIZE: "20",
    }],
  ] as const
) {
  withApi(
    `idempotent_admission: 20 concurrent spawns with one key make one run (${label})`,
    env,
    async (db, api) => {
      const [tenant, token] = await newTenant(db, "race");
      for (let round = 0; round < 3; round++) {
        const K = `race-${round}-${crypto.randomUUID()}`;
        const clients = Array.from({ length: 20 }, () => Deno.createHttpClient({}));
        try {
          const results = await Promise.all(
            clients.map((client) =>
              post(api, token, { workflow_ref: "echo", input: {}, dispatch_key: K }, client)
            ),
          );
          const ids = new Set(results.map((r) => r.body.run_id));
          assert.equal(ids.size, 1, `ids: ${[...ids]}`);
          assert.deepEqual(
            results.map((r) => r.status).sort((x, y) => x - y),
            [...Array(19).fill(200), 201],
          );
          assert.equal(await countRuns(db, tenant, K), 1);
        } finally {
          for (const c of clients) c.close();
        }
      }
    },
  );
}

// The index catches the race deterministically: a transaction holding K
// makes the admission wait; its commit hands over its run, its rollback lets
// the admission create one.
withApi(
  "idempotent_admission: an admission waits for a transaction holding its key",
  {},
  async (db, api) => {
    const [tenant, token] = await newTenant(db, "held");

    for (const outcome of ["commit", "rollback"] as const) {
      const K = `held-${outcome}`;
      const heldId = crypto.randomUUID();
      const inserted = Promise.withResolvers<void>();
      const release = Promise.withResolvers<void>();
      const holder = db.sql.begin(async (tx) => {
        await tx`insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version,
                                 input, dispatch_key, source, max_attempts)
               values (${tenant}, ${heldId}, 'echo', 'echo', 1, '{}', ${K}, 'test', 3)`;
        inserted.resolve();
        await release.promise;
        if (outcome === "rollback") throw new Error("roll back");
      }).catch((err) => {
        if (outcome !== "rollback") throw err;
      });
      await inserted.promise;

      const admission = post(api, token, { workflow_ref: "echo", input: {}, dispatch_key: K });
      // The admission must be blocked on the held key's index entry, not done.
      await waitFor("admission blocked on the held key", async () => {
        const [r] = await db.sql`
        select count(*)::int as n from pg_stat_activity
         where datname = current_database() and wait_event_type = 'Lock'
           and application_name = 'poimen-api'`;
        return r.n === 1;
      });
      assert.equal(await countRuns(db, tenant, K), 0, "the held row is not visible yet");

      release.resolve();
      await holder;
      const res = await admission;
      if (outcome === "commit") {
        assert.equal(res.status, 200);
        assert.equal(res.body.run_id, heldId);
      } else {
        assert.equal(res.status, 201);
        assert.notEqual(res.body.run_id, heldId);
      }
      assert.equal(await countRuns(db, tenant, K), 1);
    }
  },
);

// Keys are per tenant.
withApi(
  "idempotent_admission: the same key under two tenants makes two runs",
  {},
  async (db, api) => {
    const [t1, tok1] = await newTenant(db, "one");
    const [t2, tok2] = await newTenant(db, "two");
    const K = "shared-key";
    const a = await post(api, tok1, { workflow_ref: "echo", input: {}, dispatch_key: K });
    const b = await post(api, tok2, { workflow_ref: "echo", input: {}, dispatch_key: K });
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.notEqual(a.body.run_id, b.body.run_id);
    assert.equal(await countRuns(db, t1, K), 1);
    assert.equal(await countRuns(db, t2, K), 1);
    // And neither tenant sees the other's run.
    const cross = await fetch(`${api.url}/v1/runs/${b.body.run_id}`, {
      headers: { authorization: `Bearer ${tok1}` },
    });
    assert.equal(cross.status, 404);
    await cross.body?.cancel();
  },
);
