/**
 * kafka/hand_out_buffer.ts: bounded hand-out, no message handed out twice
 * across a stream restart, redelivery and revocation. Pure; no broker.
 *
 *   deno test -A tests/kafka_hand_out_buffer_test.ts
 */
import assert from "node:assert/strict";
import { HandOutBuffer } from "../kafka/hand_out_buffer.ts";
import { message } from "./support/fake_group_client.ts";

const text = (m: { value: Uint8Array } | undefined) => m && new TextDecoder().decode(m.value);

Deno.test("hand-out buffer: full at either limit, drained below half of both", () => {
  const byCount = new HandOutBuffer({ maxBuffered: 4, maxBufferedBytes: 1000 });
  assert.deepEqual([0n, 1n, 2n, 3n].map((o) => byCount.push(message("t", 0, o))), [
    false,
    false,
    false,
    true,
  ]);
  assert.equal(byCount.drained, false);
  byCount.take();
  byCount.take();
  assert.equal(byCount.drained, false, "half is not below half");
  byCount.take();
  assert.equal(byCount.drained, true);

  const byBytes = new HandOutBuffer({ maxBuffered: 100, maxBufferedBytes: 10 });
  assert.equal(byBytes.push(message("t", 0, 0n, "12345")), false);
  assert.equal(byBytes.push(message("t", 0, 1n, "67890")), true);
  assert.equal(byBytes.bytes, 10);
  byBytes.take();
  byBytes.take();
  assert.equal(byBytes.bytes, 0);
  assert.equal(byBytes.drained, true);
});

Deno.test("hand-out buffer: what was handed out is not handed out again by a restarted stream", () => {
  const buffer = new HandOutBuffer({ maxBuffered: 100, maxBufferedBytes: 1000 });
  buffer.push(message("t", 0, 0n, "a"));
  buffer.push(message("t", 1, 0n, "x"));
  assert.equal(text(buffer.take()), "a");
  // A new stream starts from the committed offsets: 0 again.
  buffer.push(message("t", 0, 0n, "a"));
  buffer.push(message("t", 1, 0n, "x"));
  buffer.push(message("t", 0, 1n, "b"));
  assert.deepEqual([buffer.take(), buffer.take(), buffer.take()].map(text), ["x", "b", undefined]);
});

Deno.test("hand-out buffer: redelivery drops what is buffered from the offset and supersedes the last handed out", () => {
  const buffer = new HandOutBuffer({ maxBuffered: 100, maxBufferedBytes: 1000 });
  for (const [o, v] of [[0n, "a"], [1n, "b"], [2n, "c"]] as const) {
    buffer.push(message("t", 0, o, v));
  }
  buffer.push(message("t", 1, 0n, "x"));
  const a = buffer.take()!;
  const b = buffer.take()!;
  assert.equal(buffer.redeliverFrom("t", 0, 1n), true);
  assert.equal(b.superseded, true);
  assert.equal(a.superseded, undefined);
  assert.equal(buffer.length, 1, "c dropped, x kept");
  assert.equal(buffer.bytes, 1);
  // Nothing at or after offset 5 was handed out: nothing to do.
  assert.equal(buffer.redeliverFrom("t", 0, 5n), false);
  buffer.push(message("t", 0, 1n, "b"));
  buffer.push(message("t", 0, 2n, "c"));
  assert.deepEqual([buffer.take(), buffer.take(), buffer.take()].map(text), ["x", "b", "c"]);
});

Deno.test("hand-out buffer: a revoked partition's messages are dropped, and handed out again once reassigned", () => {
  const buffer = new HandOutBuffer({ maxBuffered: 100, maxBufferedBytes: 1000 });
  buffer.push(message("t", 0, 0n, "a"));
  buffer.push(message("t", 0, 1n, "b"));
  buffer.push(message("t", 1, 0n, "x"));
  const a = buffer.take()!;
  buffer.revoke([{ topic: "t", partition: 0 }]);
  assert.equal(a.superseded, true);
  assert.equal(buffer.length, 1);
  buffer.push(message("t", 0, 0n, "a"));
  assert.deepEqual([buffer.take(), buffer.take()].map(text), ["x", "a"]);
});

Deno.test("hand-out buffer: a topic that left the selection starts over (it may be created anew)", () => {
  const buffer = new HandOutBuffer({ maxBuffered: 100, maxBufferedBytes: 1000 });
  buffer.push(message("gone", 0, 0n, "old"));
  buffer.push(message("kept", 0, 0n, "k"));
  buffer.take();
  buffer.take();
  buffer.forgetTopicsNotIn(["kept"]);
  buffer.push(message("gone", 0, 0n, "new"));
  buffer.push(message("kept", 0, 0n, "k"));
  assert.deepEqual([buffer.take(), buffer.take()].map(text), ["new", undefined]);
});

Deno.test("hand-out buffer: a reader waiting is woken by a message or by wake()", async () => {
  const buffer = new HandOutBuffer({ maxBuffered: 100, maxBufferedBytes: 1000 });
  const first = buffer.waitForMore();
  buffer.push(message("t", 0, 0n));
  await first;
  const second = buffer.waitForMore();
  buffer.wake();
  await second;
  assert.equal(buffer.length, 1);
});
