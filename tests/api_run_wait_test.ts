import assert from "node:assert/strict";
import { preferredWait } from "../api/run_wait.ts";
import { MAX_WAIT_SECONDS } from "../contracts/wire.ts";
import { lastEventId } from "../api/run_stream.ts";
import { wantsEventStream } from "../api/runs.ts";
import { RunWatch, tenantShare } from "../api/run_watch.ts";
import { PoimenError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import { createPool } from "../db/pool.ts";
import { freshDatabase } from "./support/db.ts";

Deno.test("Prefer: wait=N is read as RFC 7240 says, bounded by the maximum; anything else asks for no wait", () => {
  assert.equal(preferredWait("wait=10"), 10);
  assert.equal(preferredWait("respond-async, WAIT = 5"), 5);
  assert.equal(preferredWait('wait="7"'), 7);
  assert.equal(preferredWait("handling=lenient, wait=0"), 0);
  assert.equal(preferredWait("wait=3600"), MAX_WAIT_SECONDS);
  for (const no of [undefined, null, "", "wait", "wait=-1", "wait=1.5", "wait=abc", "nowait=3"]) {
    assert.equal(preferredWait(no), undefined, String(no));
  }
});

Deno.test("Last-Event-ID is a seq, anything else resumes from the start; Accept picks the stream only when asked", () => {
  assert.equal(lastEventId("12"), 12);
  assert.equal(lastEventId(" 3 "), 3);
  for (const no of [undefined, null, "", "-1", "x", "1e3", "1234567890"]) {
    assert.equal(lastEventId(no), 0, String(no));
  }
  assert.equal(wantsEventStream("text/event-stream"), true);
  assert.equal(wantsEventStream("application/json, text/event-stream;q=0.9"), true);
  assert.equal(wantsEventStream("application/json"), false);
  assert.equal(wantsEventStream("*/*"), false);
  assert.equal(wantsEventStream(undefined), false);
});

Deno.test("run watch: a watcher wakes on a NOTIFY after its run moved, not before; slots are bounded and given back", async () => {
  const db = await freshDatabase();
  const watch = new RunWatch(db.sql, {
    listen: () => createPool({ url: db.url, max: 1, applicationName: "watch-test" }),
    maxWatchers: 2,
    log: silentLogger,
    recheckMs: 3_600_000,
  });
  try {
    await watch.start();
    await db.sql`insert into tenants (tenant_id) values ('acme')`;
    const newRun = async () =>
      (await db.sql<{ run_id: string }[]>`
        insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                          source, max_attempts)
        values ('acme', gen_random_uuid(), 'echo', 'echo', 1, '1', 'test', 3) returning run_id`)[0]
        .run_id;
    const [run_id, witness] = [await newRun(), await newRun()];
    const watcher = watch.open("acme", run_id);
    const witnessWatcher = watch.open("acme", witness);
    assert.throws(() => watch.open("acme", run_id), /RUN_WATCHERS_MAX/);
    let woken = false;
    const signal = new AbortController().signal;
    const next = watcher.next(1, watch.epoch, signal).then(() => woken = true);
    // The witness moves, this run does not: one NOTIFY, one check, which
    // wakes the witness's watcher and not this one.
    const epoch = watch.epoch; // before the change, as a caller reads
    await db.sql`update runs set event_seq = 2 where run_id = ${witness}`;
    await db.sql`select pg_notify('poimen_outbox', '')`;
    await witnessWatcher.next(1, epoch, signal);
    assert.equal(woken, false);
    await db.sql`update runs set event_seq = 2 where run_id = ${run_id}`;
    await db.sql`select pg_notify('poimen_outbox', '')`;
    await next;
    assert.equal(woken, true);
    witnessWatcher.close();
    watcher.close();
    watcher.close();
    watch.open("acme", run_id).close();
    watch.open("acme", witness).close();
  } finally {
    await watch.stop();
    await watch.stop();
    await db.drop();
  }
});

Deno.test("run watch: a tenant holds at most its share, refused with too-many-streams and Retry-After while others still get slots; closing gives it back; the default share is a tenth", () => {
  assert.equal(tenantShare(10_000), 1000);
  assert.equal(tenantShare(5), 1);
  // Never started and never checked: opening and closing slots needs no database.
  const pool = { url: "postgres://unused@127.0.0.1:1/x", max: 1, applicationName: "unused" };
  const watch = new RunWatch(createPool(pool), {
    listen: () => createPool(pool),
    maxWatchers: 3,
    maxPerTenant: 1,
    log: silentLogger,
  });
  const run = crypto.randomUUID();
  const first = watch.open("acme", run);
  const refusal = (() => {
    try {
      watch.open("acme", run);
    } catch (err) {
      return err;
    }
  })();
  assert.ok(refusal instanceof PoimenError);
  assert.equal(refusal.code, "too-many-streams");
  assert.equal(refusal.status, 429);
  assert.ok((refusal.retryAfterSeconds ?? 0) >= 1);
  const other = watch.open("globex", run);
  assert.equal(watch.watchers, 2);
  first.close();
  first.close();
  watch.open("acme", run).close();
  other.close();
  assert.equal(watch.watchers, 0);
});
