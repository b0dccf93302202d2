/**
 * The process harness: parts start in order and stop in reverse, a failed
 * start unwinds what started, stopping twice stops each part once, and a
 * second signal or the deadline forces the exit naming the part that hangs.
 * Signals and the exit are fakes, so the test process is never signalled.
 */
import assert from "node:assert/strict";
import { createLogger } from "../core/log.ts";
import {
  DEFAULT_STOP_DEADLINE_MS,
  type HarnessOptions,
  type Part,
  ProcessHarness,
  type SignalSource,
  stopDeadline,
} from "../core/process_harness.ts";
import { SECOND } from "../core/time.ts";
import { waitFor } from "./support/db.ts";

/** Signals a test sends by hand; `listening` tells whether the harness listens. */
function fakeSignals() {
  let handler: ((signal: Deno.Signal) => void) | undefined;
  const source: SignalSource = {
    listen(h) {
      handler = h;
      return () => (handler = undefined);
    },
  };
  return {
    source,
    get listening() {
      return handler !== undefined;
    },
    send(signal: Deno.Signal) {
      assert.ok(handler, "the harness listens for signals");
      handler(signal);
    },
  };
}

/** What the parts did, in order, and the lines the harness logged. */
function world() {
  const events: string[] = [];
  const lines: Record<string, unknown>[] = [];
  const exits: number[] = [];
  const signals = fakeSignals();
  const options = (more: Partial<HarnessOptions> = {}): HarnessOptions => ({
    log: createLogger("test", "debug", (l) => lines.push(JSON.parse(l))),
    exit: (code) => exits.push(code),
    signals: signals.source,
    // The tests send their second signal at once; the window has its own test.
    repeatedSignalMs: 0,
    ...more,
  });
  const part = (name: string, behaviour: Partial<Part> = {}): Part => ({
    name,
    async start() {
      events.push(`start ${name}`);
      await behaviour.start?.();
    },
    async stop() {
      events.push(`stop ${name}`);
      await behaviour.stop?.();
      events.push(`stopped ${name}`);
    },
  });
  const logged = (msg: string) => lines.filter((l) => l.msg === msg);
  return { events, lines, exits, signals, options, part, logged };
}

const never = () => new Promise<void>(() => {});

Deno.test("harness: parts start in order and stop in reverse on SIGTERM, exit code 0", async () => {
  const w = world();
  const harness = new ProcessHarness(
    [w.part("pool"), w.part("metrics"), w.part("worker")],
    w.options(),
  );
  const done = harness.run();
  await waitFor("all started", () => w.events.length === 3, 5_000, 1);
  assert.deepEqual(w.events, ["start pool", "start metrics", "start worker"]);
  w.signals.send("SIGTERM");
  assert.equal(await done, 0);
  assert.deepEqual(w.events.slice(3), [
    "stop worker",
    "stopped worker",
    "stop metrics",
    "stopped metrics",
    "stop pool",
    "stopped pool",
  ]);
  assert.deepEqual(w.logged("stopping").map((l) => l.signal), ["SIGTERM"]);
  assert.equal(w.logged("stopped").length, 1);
  assert.deepEqual(w.exits, [], "a graceful stop leaves the exit to the caller");
  assert.equal(w.signals.listening, false, "the signal listeners are removed");
});

Deno.test("harness: the parts of a stage start in order and stop together", async () => {
  const w = world();
  const bothStopping = Promise.withResolvers<void>();
  let stopping = 0;
  const meetAtStop = () => {
    if (++stopping === 2) bothStopping.resolve();
    return bothStopping.promise;
  };
  const done = new ProcessHarness([
    w.part("pool"),
    [w.part("relay", { stop: meetAtStop }), w.part("purger", { stop: meetAtStop })],
  ], w.options({ stopDeadlineMs: 5 * SECOND })).run();
  await waitFor("all started", () => w.events.length === 3, 5_000, 1);
  assert.deepEqual(w.events, ["start pool", "start relay", "start purger"]);
  w.signals.send("SIGINT");
  // Each stop waits for the other's to begin: sequential stops would hang
  // until the deadline forced the exit with code 1.
  assert.equal(await done, 0);
  assert.deepEqual(w.events.slice(3, 5).sort(), ["stop purger", "stop relay"]);
  assert.deepEqual(w.events.slice(-2), ["stop pool", "stopped pool"]);
});

Deno.test("harness: a part that fails to start stops the started ones in reverse; exit code 1", async () => {
  const w = world();
  const code = await new ProcessHarness([
    w.part("pool"),
    w.part("metrics"),
    w.part("worker", { start: () => Promise.reject(new Error("address in use")) }),
    w.part("never started"),
  ], w.options()).run();
  assert.equal(code, 1);
  assert.deepEqual(w.events, [
    "start pool",
    "start metrics",
    "start worker",
    "stop metrics",
    "stopped metrics",
    "stop pool",
    "stopped pool",
  ]);
  const errors = w.lines.filter((l) => l.level === "error");
  assert.equal(errors.length, 1, JSON.stringify(w.lines));
  assert.equal(errors[0].msg, "start failed");
  assert.equal(errors[0].part, "worker");
  assert.equal((errors[0].error as { message: string }).message, "address in use");
  assert.deepEqual(w.exits, []);
});

Deno.test("harness: stop() twice stops each part once, both calls resolve with the exit code", async () => {
  const w = world();
  const harness = new ProcessHarness([w.part("pool"), w.part("worker")], w.options());
  const done = harness.run();
  await waitFor("all started", () => w.events.length === 2, 5_000, 1);
  const [first, second] = await Promise.all([harness.stop(), harness.stop()]);
  assert.equal(first, 0);
  assert.equal(second, 0);
  assert.equal(await done, 0);
  assert.equal(await harness.stop(), 0, "a stop after the stop is safe too");
  assert.deepEqual(w.events.filter((e) => e.startsWith("stop ")), ["stop worker", "stop pool"]);
  assert.deepEqual(w.exits, []);
});

Deno.test("harness: the stop deadline forces the exit (code 1) naming the part that hangs", async () => {
  const w = world();
  const done = new ProcessHarness(
    [w.part("pool"), w.part("worker", { stop: never }), w.part("metrics")],
    w.options({ stopDeadlineMs: 50 }),
  ).run();
  await waitFor("all started", () => w.events.length === 3, 5_000, 1);
  w.signals.send("SIGTERM");
  assert.equal(await done, 1);
  assert.deepEqual(w.exits, [1]);
  const [forced] = w.logged("forced exit");
  assert.deepEqual(forced.did_not_stop, ["worker"]);
  assert.equal(forced.exit_code, 1);
  assert.match(String(forced.reason), /deadline of 50 ms/);
  assert.ok(!w.events.includes("stop pool"), "the parts after the hanging one are left");
  assert.equal(w.signals.listening, false);
});

Deno.test("harness: a second signal forces the exit at once (SIGTERM 143, SIGINT 130)", async () => {
  for (const [signal, code] of [["SIGTERM", 143], ["SIGINT", 130]] as const) {
    const w = world();
    const done = new ProcessHarness(
      [w.part("pool"), w.part("worker", { stop: never })],
      // Were the second signal ignored, the deadline would end it with code 1.
      w.options({ stopDeadlineMs: 5 * SECOND }),
    ).run();
    await waitFor("all started", () => w.events.length === 2, 5_000, 1);
    w.signals.send(signal);
    await waitFor("the worker stopping", () => w.events.includes("stop worker"), 5_000, 1);
    assert.deepEqual(w.exits, [], "the first signal is a graceful stop");
    w.signals.send(signal);
    assert.equal(await done, code);
    assert.deepEqual(w.exits, [code]);
    const forced = w.logged("forced exit");
    assert.equal(forced.length, 1);
    assert.deepEqual(forced[0].did_not_stop, ["worker"]);
    assert.equal(forced[0].reason, `second ${signal}`);
  }
});

Deno.test("harness: a signal repeated within the window is the same stop, not a second signal", async () => {
  const w = world();
  const stopping = Promise.withResolvers<void>();
  const done = new ProcessHarness(
    [w.part("pool"), w.part("worker", { stop: () => stopping.promise })],
    w.options({ stopDeadlineMs: 5 * SECOND, repeatedSignalMs: 60 * SECOND }),
  ).run();
  await waitFor("all started", () => w.events.length === 2, 5_000, 1);
  // A terminal's Ctrl-C, to the process and again through `deno task`.
  w.signals.send("SIGINT");
  w.signals.send("SIGINT");
  await waitFor("the worker stopping", () => w.events.includes("stop worker"), 5_000, 1);
  stopping.resolve();
  assert.equal(await done, 0);
  assert.deepEqual(w.exits, []);
  assert.equal(w.logged("forced exit").length, 0);
  assert.equal(w.logged("stopping").length, 1);
});

Deno.test("harness: a signal while a part starts starts no more parts; a second one names it", async () => {
  const w = world();
  const starting = Promise.withResolvers<void>();
  const done = new ProcessHarness(
    [w.part("pool"), w.part("worker", { start: () => starting.promise }), w.part("later")],
    w.options(),
  ).run();
  await waitFor("the worker starting", () => w.events.includes("start worker"), 5_000, 1);
  w.signals.send("SIGTERM");
  starting.resolve();
  assert.equal(await done, 0);
  assert.deepEqual(w.events, [
    "start pool",
    "start worker",
    "stop worker",
    "stopped worker",
    "stop pool",
    "stopped pool",
  ]);

  const hung = world();
  const forced = new ProcessHarness(
    [hung.part("pool"), hung.part("worker", { start: never })],
    hung.options({ stopDeadlineMs: 5 * SECOND }),
  ).run();
  await waitFor("the worker starting", () => hung.events.includes("start worker"), 5_000, 1);
  hung.signals.send("SIGTERM");
  hung.signals.send("SIGTERM");
  assert.equal(await forced, 143);
  assert.deepEqual(hung.logged("forced exit")[0].did_not_start, ["worker"]);
});

Deno.test("harness: a stop that fails does not keep the others from stopping; exit code 1", async () => {
  const w = world();
  const done = new ProcessHarness([
    w.part("pool"),
    w.part("worker", { stop: () => Promise.reject(new Error("release failed")) }),
  ], w.options()).run();
  await waitFor("all started", () => w.events.length === 2, 5_000, 1);
  w.signals.send("SIGTERM");
  assert.equal(await done, 1);
  assert.deepEqual(w.events.slice(-2), ["stop pool", "stopped pool"]);
  const [failed] = w.logged("stop failed");
  assert.equal(failed.part, "worker");
  assert.equal((failed.error as { message: string }).message, "release failed");
  assert.deepEqual(w.exits, []);
});

Deno.test("harness: the stop deadline is 30 s, or a process's own graceful wait and a margin", () => {
  assert.equal(DEFAULT_STOP_DEADLINE_MS, 30 * SECOND);
  assert.equal(stopDeadline(10 * SECOND), 30 * SECOND);
  assert.equal(stopDeadline(60 * SECOND), 80 * SECOND);
});
