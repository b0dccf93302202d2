/**
 * What one tenant's waits and event streams may take from an API process,
 * against a real API (and a real worker where runs must run): each tenant
 * holds at most its share of the watchers, a stream ends at its lifetime and
 * the real client resumes it without losing or repeating an event, and a
 * reader that stops reading makes the stream stop reading the database with
 * a bounded buffer, and is disconnected when it stalls too long.
 */
import assert from "node:assert/strict";
import { PoimenClient } from "../client/http.ts";
import type { ReconnectInfo } from "../client/follow_run.ts";
import type { RunEvent } from "../contracts/wire.ts";
import { STREAM_BUFFER_BYTES } from "../api/run_stream.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, newToken, PoimenProcess, sampleValue } from "./support/processes.ts";

const auth = (token: string) => ({ authorization: `Bearer ${token}` });

/** A run that stays queued: due in a day, so no stream on it ends by itself. */
async function queuedRun(api: ApiProcess, token: string): Promise<string> {
  const res = await fetch(`${api.url}/v1/runs`, {
    method: "POST",
    headers: { ...auth(token), "content-type": "application/json" },
    body: JSON.stringify({
      workflow_ref: "echo",
      input: 1,
      run_after: new Date(Date.now() + 24 * 3600_000).toISOString(),
    }),
  });
  assert.equal(res.status, 201, await res.clone().text());
  return (await res.json()).run_id;
}

function openStream(api: ApiProcess, token: string, runId: string, signal: AbortSignal) {
  return fetch(`${api.url}/v1/runs/${runId}/events`, {
    headers: { ...auth(token), accept: "text/event-stream" },
    signal,
  });
}

Deno.test("run streams: a tenant holding its share of waits and streams cannot stop another tenant's; its own next stream is 429 too-many-streams and its next wait is answered without waiting", async () => {
  const db = await freshDatabase();
  const acme = await newToken(db.url, "acme");
  const globex = await newToken(db.url, "globex");
  const api = new ApiProcess({
    DATABASE_URL: db.url,
    RUN_WATCHERS_MAX: "4",
    RUN_WATCHERS_PER_TENANT: "2",
  });
  const clients = new AbortController();
  const held: Response[] = [];
  try {
    await api.ready();
    const a = await queuedRun(api, acme);
    const b = await queuedRun(api, globex);

    // acme tries to take every slot of the process.
    const answers = [];
    for (let i = 0; i < 4; i++) {
      const res = await openStream(api, acme, a, clients.signal);
      answers.push(res.status);
      if (res.status === 200) held.push(res);
      else {
        assert.equal(res.status, 429);
        assert.ok(Number(res.headers.get("retry-after")) >= 1, "with Retry-After");
        const problem = await res.json();
        assert.equal(problem.type, "https://poimen.dev/problems/too-many-streams");
        assert.equal(problem.retryable, true);
        assert.match(problem.detail, /RUN_WATCHERS_PER_TENANT/);
      }
    }
    assert.deepEqual(answers, [200, 200, 429, 429]);
    assert.equal(await api.metric("poimen_run_watchers"), 2);

    // acme's wait past its share: answered at once, as the run is, no wait applied.
    const wait = await fetch(`${api.url}/v1/runs/${a}`, {
      headers: { ...auth(acme), prefer: "wait=30" },
    });
    assert.equal(wait.status, 200);
    assert.equal(wait.headers.get("preference-applied"), null);
    assert.equal((await wait.json()).status, "queued");

    // globex still gets its stream and its wait.
    const other = await openStream(api, globex, b, clients.signal);
    assert.equal(other.status, 200);
    held.push(other);
    const otherWait = await fetch(`${api.url}/v1/runs/${b}`, {
      headers: { ...auth(globex), prefer: "wait=1" },
    });
    assert.equal(otherWait.status, 200);
    assert.equal(otherWait.headers.get("preference-applied"), "wait=1");
    await otherWait.body?.cancel();

    // A stream acme closes gives its share back.
    await held.shift()!.body?.cancel();
    await waitFor("acme's slot freed", async () => (await api.metric("poimen_run_watchers")) === 2);
    const again = await openStream(api, acme, a, clients.signal);
    assert.equal(again.status, 200);
    held.push(again);
  } finally {
    clients.abort();
    for (const res of held) await res.body?.cancel().catch(() => {});
    await api.stop();
    await db.drop();
  }
});

Deno.test("run streams: a stream ends after RUN_STREAM_MAX_MS with a reconnect comment, and followRun resumes with Last-Event-ID, yielding every event exactly once", async () => {
  const db = await freshDatabase();
  const token = await newToken(db.url, "acme");
  const api = new ApiProcess({
    DATABASE_URL: db.url,
    RUN_STREAM_MAX_MS: "700",
    RUN_STREAM_HEARTBEAT_MS: "100",
  });
  const worker = new PoimenProcess("worker", {
    DATABASE_URL: db.url,
    WORKER_POLL_MS: "50",
    LOG_LEVEL: "warn",
  });
  try {
    await api.ready();
    // A raw stream on a queued run ends by itself, with the comment, then closes.
    const idle = await queuedRun(api, token);
    // Bounded here, so that a stream that never ends fails the test rather than hanging it.
    const raw = await openStream(api, token, idle, AbortSignal.timeout(30_000));
    assert.equal(raw.status, 200);
    const text = await raw.text();
    assert.match(text, /^: reconnect\b.*$/m);
    assert.ok(text.trimEnd().endsWith("resume with Last-Event-ID"), text);

    const client = new PoimenClient({ url: api.url, token });
    const { run } = await client.admitRun({ workflow_ref: "sleep", input: { ms: 3_000 } });
    const reconnects: ReconnectInfo[] = [];
    const events: RunEvent[] = [];
    for await (
      const event of client.followRun(run.run_id, { onReconnect: (r) => reconnects.push(r) })
    ) {
      events.push(event);
    }
    assert.deepEqual(events.map((e) => e.seq), [1, 2, 3]);
    assert.deepEqual(events.map((e) => e.type), ["run.admitted", "run.started", "run.succeeded"]);
    assert.ok(reconnects.length >= 2, `reconnected ${reconnects.length} times`);
    for (const r of reconnects) {
      assert.equal(r.error, undefined, "ended by the API, not cut");
      assert.equal(r.delayMs, 0, "a stream at its lifetime is resumed at once");
    }
    // The resumptions carried what had been seen: the last seq, never going back.
    const afters = reconnects.map((r) => r.after);
    assert.deepEqual(afters, [...afters].sort((x, y) => x - y));
    assert.ok(afters.includes(2), `resumed after run.started: ${afters}`);
    assert.ok(
      (await api.metric("poimen_run_streams_ended_total", { reason: "lifetime" })) >= 3,
      "the streams ended at their lifetime",
    );
  } finally {
    await worker.stop();
    await api.stop();
    await db.drop();
  }
});

Deno.test("run streams: a reader that stops reading while many events are produced keeps the API's buffered bytes and its reads from the database bounded, and loses nothing once it reads again", async () => {
  const db = await freshDatabase();
  const token = await newToken(db.url, "acme");
  const api = new ApiProcess({ DATABASE_URL: db.url, RUN_STREAM_STALL_MS: "600000" });
  const EVENTS = 3000;
  const PAD = 16 * 1024; // 3000 × 16 KiB ≈ 48 MiB: far more than the sockets' buffers hold
  try {
    await api.ready();
    const runId = await queuedRun(api, token);
    // The producer: a run's timeline of many large events, as the API's
    // statements would append them (run.admitted is seq 1).
    await db.sql`
      insert into work_events (tenant_id, run_id, seq, type, payload)
      select 'acme', ${runId}, s, 'test.padding', jsonb_build_object('pad', repeat('x', ${PAD}))
        from generate_series(2, ${EVENTS + 1}) s`;
    await db.sql`update runs set event_seq = ${EVENTS + 1} where run_id = ${runId}`;

    const res = await openStream(api, token, runId, new AbortController().signal);
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    await reader.read(); // the stream started; now its reader stops reading

    // The stream fills its buffer, then stops: the events it wrote no
    // longer grow (five samples in a row) while its buffer holds bytes.
    let last = -1;
    let same = 0;
    const [sent, buffered] = await waitFor(
      "the stream to stop writing",
      async () => {
        const text = await (await fetch(`${api.url}/metrics`)).text();
        const now = sampleValue(text, "poimen_run_stream_events_total", {});
        const held = sampleValue(text, "poimen_run_stream_buffered_bytes", {});
        same = now === last && held > 0 ? same + 1 : 0;
        last = now;
        return same >= 5 ? [now, held] : undefined;
      },
      60_000,
      200,
    );
    assert.ok(
      buffered <= STREAM_BUFFER_BYTES + PAD + 1024,
      `buffered ${buffered} bytes, over the bound`,
    );
    assert.ok(
      sent < EVENTS / 2,
      `the stream read ${sent} of ${EVENTS} events for a stalled reader`,
    );

    // Reading again: every event, in order, once.
    const decoder = new TextDecoder();
    let text = "";
    const seqs: number[] = [];
    while (seqs.at(-1) !== EVENTS + 1) {
      const { value, done } = await reader.read();
      assert.equal(done, false, `ended after seq ${seqs.at(-1)}`);
      text += decoder.decode(value, { stream: true });
      const blocks = text.split("\n\n");
      text = blocks.pop()!;
      for (const block of blocks) {
        const id = /^id: (\d+)$/m.exec(block);
        if (id) seqs.push(Number(id[1]));
      }
    }
    assert.equal(seqs.length, EVENTS + 1);
    assert.ok(seqs.every((s, i) => s === i + 1), "in order, none missing or repeated");
    await reader.cancel();
  } finally {
    await api.stop();
    await db.drop();
  }
});

Deno.test("run streams: a reader that leaves its stream unread past RUN_STREAM_STALL_MS is disconnected and its slot freed", async () => {
  const db = await freshDatabase();
  const token = await newToken(db.url, "acme");
  const api = new ApiProcess({ DATABASE_URL: db.url, RUN_STREAM_STALL_MS: "500" });
  try {
    await api.ready();
    const runId = await queuedRun(api, token);
    await db.sql`
      insert into work_events (tenant_id, run_id, seq, type, payload)
      select 'acme', ${runId}, s, 'test.padding', jsonb_build_object('pad', repeat('x', 16384))
        from generate_series(2, 3001) s`;
    await db.sql`update runs set event_seq = 3001 where run_id = ${runId}`;
    const res = await openStream(api, token, runId, new AbortController().signal);
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    await reader.read();
    await waitFor(
      "the stalled stream cut",
      async () => (await api.metric("poimen_run_streams_ended_total", { reason: "stalled" })) === 1,
    );
    assert.equal(await api.metric("poimen_run_watchers"), 0, "its slot is free");
    await reader.cancel().catch(() => {});
  } finally {
    await api.stop();
    await db.drop();
  }
});
