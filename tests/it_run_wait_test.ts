/**
 * Waiting for a run (`Prefer: wait=N`) and following its events
 * (`text/event-stream`) against a real API process and a real worker: the
 * answer comes when the run is final or at the deadline, the stream ends
 * after the final event and resumes from `Last-Event-ID`, the number of
 * watchers is bounded and a client that goes away frees its slot, and
 * another tenant's run is a 404 either way.
 */
import assert from "node:assert/strict";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, newToken, PoimenProcess } from "./support/processes.ts";

interface Ctx {
  db: TestDatabase;
  api: ApiProcess;
  token: string;
  other: string;
  post(body: unknown, headers?: Record<string, string>): Promise<Response>;
  get(path: string, headers?: Record<string, string>, signal?: AbortSignal): Promise<Response>;
}

function waitTest(name: string, env: Record<string, string>, fn: (ctx: Ctx) => Promise<void>) {
  Deno.test(`run wait: ${name}`, async () => {
    const db = await freshDatabase();
    const token = await newToken(db.url, "acme");
    const other = await newToken(db.url, "globex");
    const api = new ApiProcess({ DATABASE_URL: db.url, ...env });
    const worker = new PoimenProcess("worker", {
      DATABASE_URL: db.url,
      WORKER_POLL_MS: "50",
      WORKER_CONCURRENCY: "8",
      LOG_LEVEL: "warn",
    });
    const auth = (t: string) => ({ authorization: `Bearer ${t}` });
    try {
      await api.ready();
      await fn({
        db,
        api,
        token,
        other,
        post: (body, headers = {}) =>
          fetch(`${api.url}/v1/runs`, {
            method: "POST",
            headers: { ...auth(token), "content-type": "application/json", ...headers },
            body: JSON.stringify(body),
          }),
        get: (path, headers = {}, signal) =>
          fetch(`${api.url}${path}`, { headers: { ...auth(token), ...headers }, signal }),
      });
    } finally {
      await worker.stop();
      await api.stop();
      await db.drop();
    }
  });
}

waitTest(
  "POST with Prefer: wait=10 answers once the run succeeded, with its result; a replay waits the same way and keeps its meaning",
  {},
  async (ctx) => {
    const body = { workflow_ref: "sleep", input: { ms: 500 }, dispatch_key: "w-1" };
    const res = await ctx.post(body, { prefer: "wait=10" });
    assert.equal(res.status, 201);
    assert.equal(res.headers.get("preference-applied"), "wait=10");
    const run = await res.json();
    assert.equal(run.status, "succeeded");
    assert.deepEqual(run.result, { slept_ms: 500 });

    const replay = await ctx.post(body, { prefer: "wait=10" });
    assert.equal(replay.status, 200);
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal((await replay.json()).status, "succeeded");

    // Without the header nothing changes: the run as admitted.
    const plain = await ctx.post({ workflow_ref: "sleep", input: { ms: 500 } });
    assert.equal(plain.status, 201);
    assert.equal(plain.headers.get("preference-applied"), null);
    assert.equal((await plain.json()).status, "queued");
  },
);

waitTest(
  "GET with Prefer: wait=1 on a run that takes longer answers after the wait with the run still running; a longer wait than the maximum is cut to it",
  {},
  async (ctx) => {
    const run = await (await ctx.post({ workflow_ref: "sleep", input: { ms: 20_000 } })).json();
    await waitFor("the run started", async () => {
      const r = await (await ctx.get(`/v1/runs/${run.run_id}`)).json();
      return r.status === "running";
    }, 15_000);
    const started = performance.now();
    const res = await ctx.get(`/v1/runs/${run.run_id}`, { prefer: "wait=1" });
    const waited = performance.now() - started;
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("preference-applied"), "wait=1");
    assert.equal((await res.json()).status, "running");
    assert.ok(waited >= 900, `answered after ${waited} ms, before the wait`);

    const quick = await (await ctx.post({ workflow_ref: "echo", input: 1 })).json();
    const capped = await ctx.get(`/v1/runs/${quick.run_id}`, { prefer: "respond-async, wait=600" });
    assert.equal(capped.headers.get("preference-applied"), "wait=60");
    assert.equal((await capped.json()).status, "succeeded");
  },
);

/** Reads a server-sent event stream to its end: the events' ids, types and data. */
async function readStream(res: Response): Promise<{ id: number; type: string; data: unknown }[]> {
  const text = await res.text();
  const events = [];
  for (const block of text.split("\n\n")) {
    const fields = Object.fromEntries(
      block.split("\n").filter((l) => l && !l.startsWith(":")).map((l) => {
        const i = l.indexOf(":");
        return [l.slice(0, i), l.slice(i + 1).trimStart()];
      }),
    );
    if (fields.id !== undefined) {
      events.push({ id: Number(fields.id), type: fields.event, data: JSON.parse(fields.data) });
    }
  }
  return events;
}

waitTest(
  "the event stream gives the events as they happen and ends after the final one; Last-Event-ID continues from the next event; JSON stays the default",
  {
    RUN_STREAM_HEARTBEAT_MS: "100",
  },
  async (ctx) => {
    const run = await (await ctx.post({ workflow_ref: "sleep", input: { ms: 700 } })).json();
    const res = await ctx.get(`/v1/runs/${run.run_id}/events`, { accept: "text/event-stream" });
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/);
    const raw = await res.clone().text();
    assert.match(raw, /^: keep-alive$/m, "an idle stream gets comment lines");
    const events = await readStream(res);
    assert.deepEqual(events.map((e) => e.type), ["run.admitted", "run.started", "run.succeeded"]);
    assert.deepEqual(events.map((e) => e.id), [1, 2, 3]);
    assert.deepEqual((events[2].data as { seq: number }).seq, 3);

    const resumed = await readStream(
      await ctx.get(`/v1/runs/${run.run_id}/events`, {
        accept: "text/event-stream",
        "last-event-id": "1",
      }),
    );
    assert.deepEqual(resumed.map((e) => e.id), [2, 3]);

    const json = await ctx.get(`/v1/runs/${run.run_id}/events`);
    assert.match(json.headers.get("content-type") ?? "", /application\/json/);
    assert.equal((await json.json()).events.length, 3);
  },
);

waitTest(
  "waiters are bounded: past RUN_WATCHERS_MAX a wait is 503 busy with Retry-After, and a client that goes away frees its slot at once",
  {
    RUN_WATCHERS_MAX: "2",
    // One tenant may take both here (a share of the whole process is the
    // process's bound): this tests the process's bound, not the tenant's.
    RUN_WATCHERS_PER_TENANT: "2",
  },
  async (ctx) => {
    const run = await (await ctx.post({ workflow_ref: "sleep", input: { ms: 60_000 } })).json();
    const path = `/v1/runs/${run.run_id}`;
    const clients = [new AbortController(), new AbortController()];
    const held = clients.map((c) =>
      ctx.get(path, { prefer: "wait=30" }, c.signal).catch(() => null)
    );
    await waitFor(
      "two watchers held",
      async () => (await ctx.api.metric("poimen_run_watchers")) === 2,
    );

    const refused = await ctx.get(path, { prefer: "wait=30" });
    assert.equal(refused.status, 503);
    assert.ok(refused.headers.get("retry-after"));
    assert.ok((await refused.json()).type.endsWith("/busy"));
    const stream = await ctx.get(`${path}/events`, { accept: "text/event-stream" });
    assert.equal(stream.status, 503, "a stream takes a slot too");
    await stream.body?.cancel();

    clients[0].abort();
    await waitFor(
      "the slot freed",
      async () => (await ctx.api.metric("poimen_run_watchers")) === 1,
    );
    const taken = new AbortController();
    const again = ctx.get(path, { prefer: "wait=30" }, taken.signal).catch(() => null);
    await waitFor(
      "a new wait holds it",
      async () => (await ctx.api.metric("poimen_run_watchers")) === 2,
    );
    taken.abort();
    clients[1].abort();
    await Promise.all([...held, again]);
    await waitFor("all freed", async () => (await ctx.api.metric("poimen_run_watchers")) === 0);
  },
);

waitTest("another tenant's run is a 404 for a wait and for a stream", {}, async (ctx) => {
  const run = await (await ctx.post({ workflow_ref: "sleep", input: { ms: 5_000 } })).json();
  const as = (headers: Record<string, string>, path = "") =>
    fetch(`${ctx.api.url}/v1/runs/${run.run_id}${path}`, {
      headers: { authorization: `Bearer ${ctx.other}`, ...headers },
    });
  const wait = await as({ prefer: "wait=5" });
  assert.equal(wait.status, 404);
  await wait.body?.cancel();
  const stream = await as({ accept: "text/event-stream" }, "/events");
  assert.equal(stream.status, 404);
  await stream.body?.cancel();
});
