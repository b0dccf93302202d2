/**
 * The outbox publisher end to end: real Postgres, the real development broker
 * (a private one for the outage) and real `main.ts outbox` processes. Each test has its own database and
 * its own tenant (hence its own topic) and reads with a fresh consumer group
 * from the earliest offset.
 *
 *   deno test -A tests/it_outbox_publisher_test.ts
 */
import assert from "node:assert/strict";
import { assertNotLogged } from "./support/logs.ts";
import { startBroker } from "../dev/kafka.ts";
import { Admission } from "../admission/admit.ts";
import { catalogOf } from "./support/catalog.ts";
import { insertTenant } from "../db/auth.ts";
import { createPool, type Sql } from "../db/pool.ts";
import type postgres from "postgres";
import {
  claimPendingEvents,
  markPublished,
  OUTBOX_SHARDS,
  type PendingEvent,
  type ShardScope,
} from "../db/outbox.ts";
import { OutboxPublisher } from "../outbox/publisher.ts";
import { ShardLocks } from "../outbox/shard_locks.ts";
import { silentLogger } from "../core/log.ts";
import { SECOND } from "../core/time.ts";
import { type ConsumedMessage, type KafkaConsumer } from "../kafka/consumer.ts";
import { createAdmin, type KafkaAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { createProducer } from "../kafka/producer.ts";
import { type EventMessage, parseEventMessage } from "../contracts/events.ts";
import { dispatchTopic, dlqTopic, eventMessageKey, eventsTopic } from "../contracts/topics.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import {
  ApiProcess,
  freePort,
  PoimenProcess,
  runCommand,
  runFlags,
  sampleValue,
} from "./support/processes.ts";
import { BROKER, consume, KAFKA_TEST, privateBroker } from "./support/kafka.ts";

const BROKERS = BROKER;

await startBroker();

function newTenant(): string {
  return `ob-${crypto.randomUUID().slice(0, 8)}`;
}

interface EventRow extends PendingEvent {
  published_at: Date | null;
}

async function events(sql: Sql, tenant: string): Promise<EventRow[]> {
  return await sql<EventRow[]>`
    select tenant_id, run_id, seq, event_id, type, goal_id, dispatch_key, payload, at, published_at
      from work_events where tenant_id = ${tenant} order by run_id, seq`;
}

async function pendingCount(sql: Sql, tenant: string): Promise<number> {
  const [row] = await sql<{ n: number }[]>`
    select count(*)::int as n from work_events where tenant_id = ${tenant} and published_at is null`;
  return row.n;
}

/** Admits `n` echo runs for `tenant`; returns their run ids in admission order. */
async function admitRuns(
  sql: Sql,
  tenant: string,
  n: number,
  extra: (i: number) => { goal_id?: string; dispatch_key?: string } = () => ({}),
): Promise<string[]> {
  const admission = new Admission(sql, catalogOf(), { maxBatch: 64, maxConcurrent: 4 });
  const results = await Promise.all(
    Array.from({ length: n }, (_, i) =>
      admission.admit(
        { workflow_ref: "echo", input: { i }, ...extra(i) },
        { tenantId: tenant, source: "test", entry: "http" },
      )),
  );
  return results.map((r) => r.run.run_id);
}

/**
 * Appends events seq `from`..`to` to each run, as the worker would (without
 * the worker: `run.started` events of the contract, one per seq); a run's
 * events get adjacent event ids, so batches cut runs.
 */
async function appendEvents(sql: Sql, tenant: string, runIds: string[], from: number, to: number) {
  await sql`
    insert into work_events (tenant_id, run_id, seq, type, goal_id, dispatch_key, payload)
    select r.tenant_id, r.run_id, s.seq, 'run.started', r.goal_id, r.dispatch_key,
           jsonb_build_object('attempt', s.seq, 'worker', 'test')
      from runs r
     cross join generate_series(${from}::int, ${to}::int) as s(seq)
     where r.tenant_id = ${tenant} and r.run_id = any(${runIds}::uuid[])
     order by r.run_id, s.seq`;
}

/** The message's value, parsed with the wire contract (so a message off the contract fails the test). */
function valueOf(m: ConsumedMessage): EventMessage {
  return parseEventMessage(m.value);
}

/** Asserts every (run, seq) arrived exactly once and each run's events in seq order. */
function assertOncePerRunInOrder(got: ConsumedMessage[], expected: number) {
  const seen = new Map<string, number[]>();
  for (const m of got) {
    const runId = m.headers["poimen-run-id"];
    const list = seen.get(runId) ?? [];
    list.push(Number(m.headers["poimen-seq"]));
    seen.set(runId, list);
  }
  let total = 0;
  for (const [runId, seqs] of seen) {
    const inOrder = seqs.every((s, i) => s === i + 1);
    assert.ok(inOrder, `run ${runId} arrived as seq ${seqs.join(",")}`);
    total += seqs.length;
  }
  assert.equal(total, expected);
}

function outbox(db: TestDatabase, env: Record<string, string> = {}): PoimenProcess {
  return new PoimenProcess("outbox", {
    DATABASE_URL: db.url,
    KAFKA_BROKERS: BROKERS,
    LOG_LEVEL: "info",
    TOPIC_PARTITIONS: "3",
    ...env,
  });
}

async function stopAll(procs: PoimenProcess[]) {
  const statuses = await Promise.all(procs.map((p) => p.stop()));
  for (const [i, s] of statuses.entries()) {
    assert.equal(s.code, 0, `outbox ${i} exited ${s.code}:\n${procs[i].logs().join("\n")}`);
  }
}

Deno.test({
  name: "outbox_publisher: events arrive in seq order per run with key, value and headers",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const tenant = newTenant();
    const port = freePort();
    let proc: PoimenProcess | undefined;
    let consumer: KafkaConsumer | undefined;
    try {
      await insertTenant(db.sql, tenant);
      const runIds = await admitRuns(
        db.sql,
        tenant,
        6,
        (i) => i % 2 === 0 ? { goal_id: `goal-${i}`, dispatch_key: `key-${i}` } : {},
      );
      await appendEvents(db.sql, tenant, runIds, 2, 4);
      const rows = await events(db.sql, tenant);
      assert.equal(rows.length, 24);

      proc = outbox(db, { OUTBOX_METRICS_PORT: String(port) });
      await waitFor("all events published", async () => {
        if (proc!.exited) throw new Error(proc!.logs().join("\n"));
        return (await pendingCount(db.sql, tenant)) === 0;
      });

      const topic = eventsTopic(tenant);
      const c = consume(topic);
      consumer = c.consumer;
      await waitFor("24 messages consumed", () => c.got.length >= 24);
      assertOncePerRunInOrder(c.got, 24);

      const byKey = new Map(rows.map((r) => [`${r.run_id}/${r.seq}`, r]));
      for (const m of c.got) {
        const v = valueOf(m);
        const row = byKey.get(`${v.run_id}/${v.seq}`);
        assert.ok(row, `unexpected event ${JSON.stringify(v)}`);
        assert.equal(m.topic, topic);
        assert.equal(m.key, `${tenant}/${row.run_id}`);
        assert.equal(m.key, eventMessageKey(tenant, row.run_id));
        assert.deepEqual(v, {
          event_id: Number(row.event_id),
          tenant_id: tenant,
          run_id: row.run_id,
          seq: row.seq,
          type: row.type,
          goal_id: row.goal_id,
          dispatch_key: row.dispatch_key,
          payload: row.payload,
          at: row.at.toISOString(),
        });
        assert.equal(m.headers["poimen-event-id"], row.event_id);
        assert.equal(m.headers["poimen-run-id"], row.run_id);
        assert.equal(m.headers["poimen-seq"], String(row.seq));
        assert.equal(m.headers["poimen-type"], row.type);
        assert.equal(m.headers["poimen-tenant-id"], tenant);
        assert.equal(m.headers["poimen-goal-id"], row.goal_id ?? undefined);
        assert.equal(m.headers["poimen-dispatch-key"], row.dispatch_key ?? undefined);
      }
      // One key, one partition: all of a run's events share it.
      const partitions = new Map<string, Set<number>>();
      for (const m of c.got) {
        partitions.set(m.key, (partitions.get(m.key) ?? new Set()).add(m.partition));
      }
      for (const [key, set] of partitions) assert.equal(set.size, 1, `${key} spans partitions`);
      assert.equal(
        (await events(db.sql, tenant)).filter((r) => r.published_at === null).length,
        0,
      );

      const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      assert.equal(sampleValue(text, "poimen_outbox_events_shipped_total", {}), 24);
      assert.equal(sampleValue(text, "poimen_outbox_pending_events", {}), 0);
      assert.equal(sampleValue(text, "poimen_outbox_oldest_pending_age_seconds", {}), 0);
      assert.ok(sampleValue(text, "poimen_outbox_publish_duration_seconds_count", {}) >= 1);
      const health = await fetch(`http://127.0.0.1:${port}/healthz`);
      await health.body?.cancel();
      assert.equal(health.status, 200);

      const status = await proc.stop();
      assert.equal(status.code, 0, proc.logs().join("\n"));
    } finally {
      await consumer?.close();
      await proc?.stop();
      await db.drop();
    }
  },
});

/**
 * One connection of the pool, pinned, and a scope of every shard naming its
 * session: what a publisher holding all the shards claims with.
 */
async function pinned(sql: Sql): Promise<{ conn: postgres.ReservedSql; scope: ShardScope }> {
  const conn = await sql.reserve();
  const [{ pid }] = await conn<{ pid: number }[]>`select pg_backend_pid() as pid`;
  const shards = Array.from({ length: OUTBOX_SHARDS }, (_, i) => i);
  return { conn, scope: { shards, pid } };
}

Deno.test("outbox_publisher: a batch cut by its limit never ships a later seq of a run without the earlier ones", async () => {
  const db = await freshDatabase();
  const tenant = newTenant();
  const { conn, scope } = await pinned(db.sql);
  try {
    await insertTenant(db.sql, tenant);
    const [held, free] = await admitRuns(db.sql, tenant, 2);
    // Seq 3 written before seq 2: event ids out of seq order.
    await appendEvents(db.sql, tenant, [held], 3, 3);
    await appendEvents(db.sql, tenant, [held], 2, 2);
    // The three oldest rows hold seq 1 and 3 of `held`, not seq 2: `held` waits.
    const first = await claimPendingEvents(conn, 3, 1 << 20, scope);
    assert.deepEqual(first.map((e) => [e.run_id, e.seq]), [[free, 1]]);
    await markPublished(conn, first);
    const next = await claimPendingEvents(conn, 100, 1 << 20, scope);
    assert.deepEqual(next.map((e) => [e.run_id, e.seq]), [[held, 1], [held, 2], [held, 3]]);
    // Read on another session than the one holding the shards' locks: nothing.
    await db.sql.begin(async (other) => {
      assert.equal((await claimPendingEvents(other, 100, 1 << 20, scope)).length, 0);
    });
  } finally {
    conn.release();
    await db.drop();
  }
});

Deno.test("outbox_publisher: publishers split the shards by session locks, claim only their own runs, and take a stopped one's shards", async () => {
  const db = await freshDatabase();
  const tenant = newTenant();
  const locks = ["a", "b"].map((name) =>
    new ShardLocks({
      session: createPool({ url: db.url, max: 1, applicationName: `poimen-test-shards-${name}` }),
      rebalanceMs: 0,
      log: silentLogger,
    })
  );
  try {
    await insertTenant(db.sql, tenant);
    const runIds = await admitRuns(db.sql, tenant, 40);
    const [a, b] = locks;
    // A alone takes every shard; once B joins, A gives half back and B takes them.
    assert.equal((await a.scope()).shards.length, OUTBOX_SHARDS);
    assert.equal((await b.scope()).shards.length, 0, "all taken: B waits for A to give back");
    assert.equal((await a.scope()).shards.length, OUTBOX_SHARDS / 2);
    const [sa, sb] = [await a.scope(), await b.scope()];
    assert.equal(sb.shards.length, OUTBOX_SHARDS / 2);
    assert.deepEqual(
      [...sa.shards, ...sb.shards].sort((x, y) => x - y),
      Array.from({ length: OUTBOX_SHARDS }, (_, i) => i),
    );
    // Each claims only the runs of its shards: together every run, once.
    const got = [
      await claimPendingEvents(a.session, 500, 1 << 20, sa),
      await claimPendingEvents(b.session, 500, 1 << 20, sb),
    ].map((batch) => batch.map((e) => e.run_id));
    assert.ok(got[0].length > 0 && got[1].length > 0, `split ${got[0].length}/${got[1].length}`);
    assert.equal(new Set([...got[0], ...got[1]]).size, 40);
    assert.equal(got[0].length + got[1].length, runIds.length);
    // B's scope read on A's session (not the one holding B's locks): nothing.
    assert.equal((await claimPendingEvents(a.session, 500, 1 << 20, sb)).length, 0);
    // B stops: its session's locks go with it, and A takes every shard again.
    await b.close();
    assert.equal((await a.scope()).shards.length, OUTBOX_SHARDS);
    const all = await claimPendingEvents(a.session, 500, 1 << 20, await a.scope());
    assert.equal(all.length, 40);
  } finally {
    for (const l of locks) await l.close();
    await db.drop();
  }
});

Deno.test("outbox_publisher: a batch holds at most maxBytes of payload, the oldest event always, the rest next time", async () => {
  const db = await freshDatabase();
  const tenant = newTenant();
  try {
    await insertTenant(db.sql, tenant);
    const runs = await admitRuns(db.sql, tenant, 4);
    // The run.admitted events out of the way: only the large ones below are pending.
    await db.sql`update work_events set published_at = now() where tenant_id = ${tenant}`;
    // One 3,000-byte payload per run, oldest first.
    for (const run of runs) {
      await db.sql`
        insert into work_events (tenant_id, run_id, seq, type, payload)
        values (${tenant}, ${run}, 2, 'run.step', jsonb_build_object('pad', repeat('x', 2988)))`;
    }
    const [{ len }] = await db.sql<{ len: number }[]>`
      select octet_length(payload::text)::int as len from work_events
       where tenant_id = ${tenant} and seq = 2 limit 1`;
    const batches: string[][] = [];
    const more: boolean[] = [];
    const { conn, scope } = await pinned(db.sql);
    for (;;) {
      // Room for two and a half payloads: two go.
      const got = await claimPendingEvents(conn, 100, Math.floor(len * 2.5), scope);
      await markPublished(conn, got);
      if (got.length === 0) break;
      for (const e of got) assert.equal(e.payload.length, len, "the payload text as stored");
      more.push(got[0].more);
      batches.push(got.map((e) => e.run_id));
    }
    assert.deepEqual(batches, [runs.slice(0, 2), runs.slice(2, 4)]);
    assert.deepEqual(more, [true, false], "the first batch was cut by bytes: more may be pending");
    // One payload larger than the bound still goes, alone: it is never stuck.
    await db.sql`
      insert into work_events (tenant_id, run_id, seq, type, payload)
      values (${tenant}, ${runs[0]}, 3, 'run.step', '{"big": true}'),
             (${tenant}, ${runs[1]}, 3, 'run.step', '{"big": true}')`;
    const alone = await claimPendingEvents(conn, 100, 1, scope);
    assert.deepEqual(alone.map((e) => [e.run_id, e.seq]), [[runs[0], 3]]);
    assert.equal(alone[0].more, true, "the other was left for the next batch");
    conn.release();
  } finally {
    await db.drop();
  }
});

Deno.test({
  name: "outbox_publisher: two processes ship 300 events of 60 runs once each, in order per run",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const tenant = newTenant();
    const topic = eventsTopic(tenant);
    const procs: PoimenProcess[] = [];
    let consumer: KafkaConsumer | undefined;
    const admin = createAdmin({ brokers: [BROKERS], clientId: "poimen-test" });
    try {
      await insertTenant(db.sql, tenant);
      const runIds = await admitRuns(db.sql, tenant, 60);
      await appendEvents(db.sql, tenant, runIds, 2, 3);
      // Batches of 7 cut through runs of 3-5 pending events, so the two
      // processes keep claiming different parts of one run: exactly where
      // per-run order could break.
      const env = { OUTBOX_BATCH_SIZE: "7", OUTBOX_POLL_MS: "5", LOG_LEVEL: "warn" };
      procs.push(outbox(db, env), outbox(db, env));
      // More events land while the first ones are being shipped.
      await waitFor("shipping under way", async () => {
        for (const p of procs) if (p.exited) throw new Error(p.logs().join("\n"));
        return (await pendingCount(db.sql, tenant)) < 180;
      });
      await appendEvents(db.sql, tenant, runIds, 4, 5);
      await waitFor("all 300 events published", async () => {
        for (const p of procs) if (p.exited) throw new Error(p.logs().join("\n"));
        return (await pendingCount(db.sql, tenant)) === 0;
      });
      assert.equal((await events(db.sql, tenant)).length, 300);

      const c = consume(topic);
      consumer = c.consumer;
      await waitFor("300 messages consumed", () => c.got.length >= 300);
      assertOncePerRunInOrder(c.got, 300);
      // Nothing shipped twice: the topic holds exactly 300 records in all.
      const ends = await admin.endOffsets([topic]);
      assert.equal(ends.reduce((sum, o) => sum + o.offset, 0n), 300n);

      await stopAll(procs);
    } finally {
      await consumer?.close();
      await Promise.all(procs.map((p) => p.stop()));
      await admin.close();
      await db.drop();
    }
  },
});

/** The outbox's sessions of this database in a transaction or holding a snapshot, as text. */
async function openOutboxTransactions(sql: Sql): Promise<string[]> {
  const rows = await sql<{ line: string }[]>`
    select application_name || ' ' || state || ' xid=' || coalesce(backend_xid::text, '-') ||
           ' xmin=' || coalesce(backend_xmin::text, '-') || ': ' || query as line
      from pg_stat_activity
     where datname = current_database() and application_name like 'poimen-outbox%'
       and (state like 'idle in transaction%'
            -- A statement running holds a snapshot for its length: not one a second old.
            -- An idle session holds none, whatever xact_start the sample caught
            -- (state and xact_start are not read as one: CI saw an idle session
            -- with an old xact_start).
            or (state <> 'idle' and xact_start < now() - interval '1 second'))`;
  return rows.map((r) => r.line);
}

async function outboxSessions(sql: Sql): Promise<number> {
  const [row] = await sql<{ n: number }[]>`
    select count(*)::int as n from pg_stat_activity
     where datname = current_database() and application_name like 'poimen-outbox%'`;
  return row.n;
}

Deno.test({
  name:
    "outbox_publisher: broker down, events wait in postgres with no outbox transaction open, and are all shipped when it returns",
  ...KAFKA_TEST,
  async fn() {
    // A broker of this test's own, so taking it down disturbs nothing else.
    await using broker = await privateBroker();
    const db = await freshDatabase();
    const tenant = newTenant();
    const topic = eventsTopic(tenant);
    let proc: PoimenProcess | undefined;
    let consumer: KafkaConsumer | undefined;
    try {
      await insertTenant(db.sql, tenant);
      proc = outbox(db, { OUTBOX_RETRY_MAX_MS: "1000", KAFKA_BROKERS: broker.address });
      const before = await admitRuns(db.sql, tenant, 10);
      await waitFor("first events published", async () => {
        if (proc!.exited) throw new Error(proc!.logs().join("\n"));
        return (await pendingCount(db.sql, tenant)) === 0;
      });

      let after: string[] = [];
      try {
        assert.equal(await broker.stop(), true, "the broker was running");
        // Admission needs Postgres only: it keeps working.
        after = await admitRuns(db.sql, tenant, 20);
        await appendEvents(db.sql, tenant, after, 2, 3);
        await waitFor("the outage noticed", () => {
          if (proc!.exited) throw new Error(proc!.logs().join("\n"));
          return proc!.logs().some((l) => l.includes('"msg":"kafka unavailable'));
        }, 60_000);
        assert.equal(await pendingCount(db.sql, tenant), 60);
        const waiting = (await events(db.sql, tenant)).filter((r) => after.includes(r.run_id));
        assert.ok(waiting.every((r) => r.published_at === null));
        // While its sends fail and time out, the outbox holds no transaction
        // open (one would hold back vacuum of work_events and runs): sampled
        // over 3 s of the outage, none of its sessions sits in one.
        let samples = 0;
        const deadline = Date.now() + 3 * SECOND;
        while (Date.now() < deadline) {
          const open = await openOutboxTransactions(db.sql);
          assert.deepEqual(open, [], "an outbox transaction open during the outage");
          samples++;
        }
        assert.ok(samples > 20, `only ${samples} samples`);
        assert.ok(
          (await outboxSessions(db.sql)) >= 2,
          "the outbox's pool and its lock session are connected",
        );
      } finally {
        await broker.start();
      }

      await waitFor("every event shipped after the broker returned", async () => {
        if (proc!.exited) throw new Error(proc!.logs().join("\n"));
        return (await pendingCount(db.sql, tenant)) === 0;
      }, 120_000);
      const c = consume(topic, broker.address);
      consumer = c.consumer;
      const expected = before.length + after.length * 3;
      const distinct = () =>
        new Set(c.got.map((m) => `${m.headers["poimen-run-id"]}/${m.headers["poimen-seq"]}`));
      await waitFor(
        `${expected} distinct events consumed`,
        () => distinct().size >= expected,
        60_000,
      );
      assert.equal(distinct().size, expected);
      for (const runId of [...before, ...after]) {
        const seqs = [...distinct()].filter((k) => k.startsWith(`${runId}/`)).length;
        assert.equal(seqs, before.includes(runId) ? 1 : 3, `run ${runId}`);
      }
      // One warning for the outage, not one per retry.
      const warnings = proc.logs().filter((l) => l.includes('"msg":"kafka unavailable'));
      assert.equal(warnings.length, 1, warnings.join("\n"));

      const status = await proc.stop();
      assert.equal(status.code, 0, proc.logs().join("\n"));
    } finally {
      await consumer?.close();
      await proc?.stop();
      await db.drop();
    }
  },
});

Deno.test({
  name: "outbox_publisher: published rows past retention are purged, pending ones never",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const tenant = newTenant();
    let proc: PoimenProcess | undefined;
    try {
      await insertTenant(db.sql, tenant);
      const runIds = await admitRuns(db.sql, tenant, 6);
      const [oldA, oldB, oldC, recent, ...pending] = runIds;
      await db.sql`
        update work_events set published_at = now() - interval '2 hours'
         where tenant_id = ${tenant} and run_id = any(${[oldA, oldB, oldC]}::uuid[])`;
      await db.sql`
        update work_events set published_at = now() - interval '10 minutes'
         where tenant_id = ${tenant} and run_id = ${recent}`;
      // Pending for days: old, but never published, so never purged.
      await db.sql`
        update work_events set at = now() - interval '3 days'
         where tenant_id = ${tenant} and run_id = any(${pending}::uuid[])`;

      // No broker answers on this port: pending rows stay pending for the whole test.
      proc = outbox(db, {
        KAFKA_BROKERS: `127.0.0.1:${freePort()}`,
        OUTBOX_RETENTION_MS: String(60 * 60 * 1000),
        OUTBOX_PURGE_INTERVAL_MS: "50",
        OUTBOX_PURGE_BATCH_SIZE: "2",
      });
      await waitFor("old published rows purged", async () => {
        if (proc!.exited) throw new Error(proc!.logs().join("\n"));
        return (await events(db.sql, tenant)).length === 3;
      });
      let left = await events(db.sql, tenant);
      assert.deepEqual(left.map((r) => r.run_id).sort(), [recent, ...pending].sort());

      // Later rounds go on purging what ages past retention, and still leave pending rows.
      await db.sql`
        update work_events set published_at = now() - interval '61 minutes'
         where tenant_id = ${tenant} and run_id = ${recent}`;
      await waitFor("the aged row purged by a later round", async () => {
        if (proc!.exited) throw new Error(proc!.logs().join("\n"));
        return (await events(db.sql, tenant)).length === 2;
      });
      left = await events(db.sql, tenant);
      assert.deepEqual(left.map((r) => r.run_id).sort(), [...pending].sort());
      assert.ok(left.every((r) => r.published_at === null));
      const status = await proc.stop();
      assert.equal(status.code, 0, proc.logs().join("\n"));
    } finally {
      await proc?.stop();
      await db.drop();
    }
  },
});

Deno.test({
  name: "outbox_publisher: the publisher ships in-process and stopping it twice is safe",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const tenant = newTenant();
    const client = { brokers: [BROKERS], clientId: "poimen-test" };
    const publisher = new OutboxPublisher(db.sql, {
      createProducer: () => createProducer({ ...client, retries: 5 }),
      admin: createAdmin(client),
    }, {
      batchSize: 500,
      pollMs: 20,
      sendTimeoutMs: 30_000,
      retryMaxMs: 1000,
      shutdownMs: 5000,
      topics: { partitions: 1, replicationFactor: 1, retentionMs: 60_000 },
      log: silentLogger,
      session: createPool({ url: db.url, max: 1, applicationName: "poimen-test-outbox" }),
    });
    try {
      await insertTenant(db.sql, tenant);
      await publisher.start();
      await admitRuns(db.sql, tenant, 3);
      await waitFor("events published", async () => (await pendingCount(db.sql, tenant)) === 0);
      await Promise.all([publisher.stop(), publisher.stop()]);
      await publisher.stop();
      // Stopped: new events stay pending.
      await admitRuns(db.sql, tenant, 1);
      assert.equal(await pendingCount(db.sql, tenant), 1);
    } finally {
      await publisher.stop();
      await db.drop();
    }
  },
});

Deno.test("outbox_publisher: a bad KAFKA_BROKERS is one line naming it and exit code 2", async () => {
  const { code, stderr } = await runCommand(
    "outbox",
    [],
    { KAFKA_BROKERS: "not a broker list", DATABASE_URL: "postgres://postgres@127.0.0.1:1/none" },
    runFlags("outbox"),
  );
  assert.equal(code, 2);
  const lines = stderr.trim().split("\n");
  assert.equal(lines.length, 1, stderr);
  assert.match(lines[0], /KAFKA_BROKERS/);
});

interface ParkRow {
  run_id: string;
  seq: number;
  published_at: Date | null;
  parked_at: Date | null;
  parked_reason: string | null;
}

async function parkState(sql: Sql, tenant: string, runId: string): Promise<ParkRow[]> {
  return await sql<ParkRow[]>`
    select run_id, seq, published_at, parked_at, parked_reason
      from work_events where tenant_id = ${tenant} and run_id = ${runId} order by seq`;
}

/** Appends a `run.succeeded` event of about `bytes` bytes as seq `seq` (the worker writes such). */
async function appendLargeEvent(
  sql: Sql,
  tenant: string,
  runId: string,
  seq: number,
  bytes: number,
) {
  await sql`
    insert into work_events (tenant_id, run_id, seq, type, payload)
    values (${tenant}, ${runId}, ${seq}, 'run.succeeded',
            jsonb_build_object('attempt', 1, 'result', repeat('x', ${bytes}::int)))`;
}

/** Whether every event of these runs is published. */
async function allPublished(sql: Sql, tenant: string, runIds: string[]): Promise<boolean> {
  const [row] = await sql<{ n: number }[]>`
    select count(*)::int as n from work_events
     where tenant_id = ${tenant} and run_id = any(${runIds}::uuid[]) and published_at is null`;
  return row.n === 0;
}

/** The distinct (run_id/seq) pairs consumed. */
function distinctEvents(got: ConsumedMessage[]): Set<string> {
  return new Set(got.map((m) => `${m.headers["poimen-run-id"]}/${m.headers["poimen-seq"]}`));
}

/** Declares `tenant`'s events topic with a small `max.message.bytes`, as an operator might. */
async function smallEventsTopic(admin: KafkaAdmin, tenant: string, maxBytes: number) {
  await admin.createTopics([{
    name: eventsTopic(tenant),
    partitions: 3,
    replicationFactor: 1,
    configs: { "max.message.bytes": String(maxBytes) },
  }]);
}

Deno.test({
  name:
    "outbox_publisher: an event the broker refuses for good is parked and reported; later runs of its tenant and of another tenant still ship",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const [tenantA, tenantB] = [newTenant(), newTenant()];
    const port = freePort();
    const admin = createAdmin({ brokers: [BROKERS], clientId: "poimen-test" });
    let proc: PoimenProcess | undefined;
    const consumers: KafkaConsumer[] = [];
    try {
      // Topics of this test's own with a 4 KiB limit: a 20 KB event is "too
      // large" without a 4 MB one. The outbox leaves existing topics as they are.
      for (const t of [tenantA, tenantB]) {
        await insertTenant(db.sql, t);
        await smallEventsTopic(admin, t, 4096);
      }
      // The poisoned run: admitted (seq 1), a huge result (seq 2), one more event (seq 3).
      const [poisoned] = await admitRuns(db.sql, tenantA, 1);
      await appendLargeEvent(db.sql, tenantA, poisoned, 2, 20_000);
      await appendEvents(db.sql, tenantA, [poisoned], 3, 3);
      // In the same batch, another run of each tenant.
      const early = [
        ...await admitRuns(db.sql, tenantA, 1),
        ...await admitRuns(db.sql, tenantB, 1),
      ];

      proc = outbox(db, { OUTBOX_METRICS_PORT: String(port) });
      await waitFor("the early runs shipped", async () => {
        if (proc!.exited) throw new Error(proc!.logs().join("\n"));
        return await allPublished(db.sql, tenantA, [early[0]]) &&
          await allPublished(db.sql, tenantB, [early[1]]);
      });

      // Five new runs per tenant afterwards, three events each: all of them ship.
      const later = { [tenantA]: [] as string[], [tenantB]: [] as string[] };
      for (const t of [tenantA, tenantB]) {
        later[t] = await admitRuns(db.sql, t, 5);
        await appendEvents(db.sql, t, later[t], 2, 3);
      }
      await waitFor("the 30 later events shipped", async () => {
        if (proc!.exited) throw new Error(proc!.logs().join("\n"));
        return await allPublished(db.sql, tenantA, later[tenantA]) &&
          await allPublished(db.sql, tenantB, later[tenantB]);
      });

      // The refused event and the one after it in its run are parked, not published.
      const rows = await parkState(db.sql, tenantA, poisoned);
      assert.deepEqual(rows.map((r) => [r.seq, r.published_at !== null, r.parked_at !== null]), [
        [1, true, false],
        [2, false, true],
        [3, false, true],
      ]);
      assert.match(rows[1].parked_reason ?? "", /MESSAGE_TOO_LARGE|RECORD_LIST_TOO_LARGE/);
      assert.equal(rows[2].parked_reason, "follows parked seq 2");

      // On the topics: everything but the parked two.
      const a = consume(eventsTopic(tenantA));
      const b = consume(eventsTopic(tenantB));
      consumers.push(a.consumer, b.consumer);
      const wantA = [poisoned, early[0], ...later[tenantA]].flatMap((r) =>
        r === poisoned
          ? [`${r}/1`]
          : r === early[0]
          ? [`${r}/1`]
          : [1, 2, 3].map((s) => `${r}/${s}`)
      );
      const wantB = [early[1], ...later[tenantB]].flatMap((r) =>
        r === early[1] ? [`${r}/1`] : [1, 2, 3].map((s) => `${r}/${s}`)
      );
      await waitFor(
        "every shipped event consumed",
        () =>
          wantA.every((k) => distinctEvents(a.got).has(k)) &&
          wantB.every((k) => distinctEvents(b.got).has(k)),
      );
      assert.deepEqual([...distinctEvents(a.got)].sort(), wantA.sort());
      assert.deepEqual([...distinctEvents(b.got)].sort(), wantB.sort());

      const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      assert.equal(sampleValue(text, "poimen_outbox_parked_events", {}), 2);
      assert.equal(sampleValue(text, "poimen_outbox_parked_events_total", {}), 2);
      assert.equal(sampleValue(text, "poimen_outbox_pending_events", {}), 0);

      // One error line naming the parked event; no outage was ever reported.
      const parkedLines = proc.logs().map((l) => JSON.parse(l)).filter((l) =>
        l.level === "error" && String(l.msg).startsWith("event parked")
      );
      assert.equal(parkedLines.length, 1, proc.logs().join("\n"));
      assert.equal(parkedLines[0].tenant, tenantA);
      assert.equal(parkedLines[0].run_id, poisoned);
      assert.equal(parkedLines[0].seq, 2);
      assert.ok(parkedLines[0].bytes > 20_000);
      assertNotLogged(
        proc.logs(),
        "kafka unavailable, events wait in postgres; retrying with backoff",
        "not an outage",
      );

      const status = await proc.stop();
      assert.equal(status.code, 0, proc.logs().join("\n"));
    } finally {
      for (const c of consumers) await c.close();
      await proc?.stop();
      await admin.close();
      await db.drop();
    }
  },
});

Deno.test({
  name:
    "outbox_publisher: an event over EVENTS_MAX_MESSAGE_BYTES is parked unsent, and declared topics carry that limit",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const tenant = newTenant();
    const client = { brokers: [BROKERS], clientId: "poimen-test" };
    const admin = createAdmin(client);
    const parkedCounts: number[] = [];
    const publisher = new OutboxPublisher(db.sql, {
      createProducer: () => createProducer({ ...client, retries: 5 }),
      admin: createAdmin(client),
    }, {
      batchSize: 500,
      pollMs: 20,
      sendTimeoutMs: 30_000,
      retryMaxMs: 1000,
      shutdownMs: 5000,
      topics: { partitions: 1, replicationFactor: 1, retentionMs: 60_000, maxMessageBytes: 8192 },
      log: silentLogger,
      hooks: { onPublished() {}, onParked: (n) => parkedCounts.push(n) },
      session: createPool({ url: db.url, max: 1, applicationName: "poimen-test-outbox" }),
    });
    try {
      await insertTenant(db.sql, tenant);
      const [big, small] = await admitRuns(db.sql, tenant, 2);
      await appendLargeEvent(db.sql, tenant, big, 2, 9000);
      await appendLargeEvent(db.sql, tenant, small, 2, 6000);
      await publisher.start();
      await waitFor("the small run shipped", () => allPublished(db.sql, tenant, [small]));
      const rows = await parkState(db.sql, tenant, big);
      assert.deepEqual(rows.map((r) => [r.seq, r.published_at !== null, r.parked_at !== null]), [
        [1, true, false],
        [2, false, true],
      ]);
      assert.match(rows[1].parked_reason ?? "", /bytes exceeds EVENTS_MAX_MESSAGE_BYTES \(8192\)/);
      assert.deepEqual(parkedCounts, [1]);

      // A later event of the parked run is parked behind it, never shipped past the gap.
      await appendEvents(db.sql, tenant, [big], 3, 3);
      await waitFor("the follower parked", async () => {
        const r = await parkState(db.sql, tenant, big);
        return r.length === 3 && r[2].parked_at !== null;
      });
      assert.equal((await parkState(db.sql, tenant, big))[2].published_at, null);
      assert.equal((await parkState(db.sql, tenant, big))[2].parked_reason, "follows parked seq 2");

      // The publisher declared the events topic with the limit; so does ensureTenantTopics.
      const config = await admin.topicConfig(eventsTopic(tenant), ["max.message.bytes"]);
      assert.equal(config["max.message.bytes"], "8192");
      const other = newTenant();
      try {
        await ensureTenantTopics(admin, other, {
          partitions: 1,
          replicationFactor: 1,
          retentionMs: 60_000,
          maxMessageBytes: 10_000,
        });
        for (
          const [topic, want] of [
            [eventsTopic(other), "10000"],
            [dispatchTopic(other), "10000"],
            [dlqTopic(other), String(10_000 + 64 * 1024)],
          ]
        ) {
          const c = await admin.topicConfig(topic, ["max.message.bytes"]);
          assert.equal(c["max.message.bytes"], want, topic);
        }
      } finally {
        await admin.deleteTopics([eventsTopic(other), dispatchTopic(other), dlqTopic(other)]);
      }
    } finally {
      await publisher.stop();
      await admin.close();
      await db.drop();
    }
  },
});

Deno.test({
  name:
    "outbox_publisher: events of a run admitted over HTTP and executed are published on a notification, long before the next poll",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const tenant = newTenant();
    const tok = await runCommand("token", [tenant], { DATABASE_URL: db.url });
    assert.equal(tok.code, 0, tok.stderr);
    // Polls a minute apart: only a notification can ship within the deadline below.
    const env = { DATABASE_URL: db.url, KAFKA_BROKERS: BROKERS, LOG_LEVEL: "warn" };
    const api = new ApiProcess(env);
    const worker = new PoimenProcess("worker", { ...env, WORKER_POLL_MS: "60000" });
    const publisher = outbox(db, { OUTBOX_POLL_MS: "60000", LOG_LEVEL: "warn" });
    const published = async (runId: string) => {
      const [r] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from work_events
         where tenant_id = ${tenant} and run_id = ${runId} and published_at is not null`;
      return r.n === 3; // run.admitted, run.started, run.succeeded
    };
    try {
      // A first run, admitted before the publisher starts (no notification): its
      // events ship in the publisher's first rounds; after them it sleeps a minute.
      const [first] = await admitRuns(db.sql, tenant, 1);
      await waitFor("the first run's events published", () => published(first));
      await api.ready();

      const res = await fetch(`${api.url}/v1/runs`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${tok.stdout.trim()}`,
          "content-type": "application/json",
        },
        body: JSON.stringify({ workflow_ref: "echo", input: { n: 2 } }),
      });
      assert.equal(res.status, 201);
      const second = (await res.json()).run_id as string;
      await waitFor(
        "the second run's events published without waiting for a poll",
        () => published(second),
        5 * SECOND,
      );
    } finally {
      const statuses = await Promise.all([api.stop(), worker.stop(), publisher.stop()]);
      await db.drop();
      for (const s of statuses) assert.equal(s.code, 0);
    }
  },
});
