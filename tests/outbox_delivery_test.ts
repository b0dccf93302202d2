/**
 * The outbox's delivery without Kafka or Postgres: `BatchDelivery` over a
 * fake sender (which refuses, or fails, the sends a script says) and a fake
 * ledger. A batch with an event the broker refuses for good is bisected
 * until that event is alone and parked, the rest ships in order; its run's
 * later events are parked behind it; an event over the limit is parked
 * unsent; a failure that may pass is thrown (the publisher's loop retries
 * it), never parked.
 *
 *   deno test -A tests/outbox_delivery_test.ts
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { ProtocolError } from "@platformatic/kafka";
import { EVENT_HEADERS } from "../contracts/events.ts";
import { createLogger } from "../core/log.ts";
import type { ClaimedEvent } from "../db/outbox.ts";
import { type ProduceMessage, recordBatchBytes } from "../kafka/producer.ts";
import { BatchDelivery, type Parked, reportParked } from "../outbox/delivery.ts";
import { toMessage } from "../outbox/event_message.ts";

const LIMIT = 1024 * 1024;

let nextId = 1;

/** A claimed event of run `run` (tenant `t`), its id unique across the file. */
function event(run: string, seq: number, extra: Partial<ClaimedEvent> = {}): ClaimedEvent {
  return {
    tenant_id: "t",
    run_id: run,
    seq,
    event_id: String(nextId++),
    type: "run.progress",
    goal_id: null,
    dispatch_key: null,
    payload: `{"n":${seq}}`,
    at: new Date(0),
    parked_seq: null,
    more: false,
    ...extra,
  };
}

/** What the fake broker does with one send: acknowledge it, refuse it for good, or be away. */
type Verdict = "ack" | "refuse" | "down";

/** Records every send; answers as `script` says. */
class FakeSender {
  /** Every send, acknowledged or not: its event ids. */
  readonly calls: string[][] = [];
  /** The sends the broker acknowledged, in order. */
  readonly acked: string[][] = [];
  /** `script` gets a send's event ids and which send it is (0-based). */
  constructor(readonly script: (ids: string[], call: number) => Verdict) {}

  readonly send = (messages: ProduceMessage[]): Promise<void> => {
    const ids = messages.map((m) => m.headers![EVENT_HEADERS.eventId]);
    const call = this.calls.push(ids) - 1;
    const verdict = this.script(ids, call);
    if (verdict === "refuse") {
      // Wrapped, as the publisher's phase tag wraps what the client throws.
      return Promise.reject(
        new Error("Producing messages failed.", { cause: new ProtocolError("MESSAGE_TOO_LARGE") }),
      );
    }
    if (verdict === "down") {
      return Promise.reject(
        new Error("Producing messages failed.", {
          cause: new ProtocolError("NOT_LEADER_OR_FOLLOWER"),
        }),
      );
    }
    this.acked.push(ids);
    return Promise.resolve();
  };
}

/** Refuses any send holding one of `poison`; acknowledges the rest. */
function refusing(poison: ClaimedEvent[]): (ids: string[]) => Verdict {
  const bad = new Set(poison.map((e) => e.event_id));
  return (ids) => ids.some((id) => bad.has(id)) ? "refuse" : "ack";
}

class FakeLedger {
  readonly parked: Parked[] = [];
  readonly marked: string[] = [];
  park(list: Parked[]): Promise<void> {
    this.parked.push(...list);
    return Promise.resolve();
  }
  markPublished(events: ClaimedEvent[]): Promise<void> {
    this.marked.push(...events.map((e) => e.event_id));
    return Promise.resolve();
  }
}

function delivery(
  sender: FakeSender,
  ledger: FakeLedger,
  opts: { maxBytes?: number; chunkBytes?: number } = {},
): BatchDelivery {
  return new BatchDelivery({
    send: sender.send,
    ledger,
    maxBytes: opts.maxBytes ?? LIMIT,
    chunkBytes: opts.chunkBytes,
  });
}

const ids = (events: ClaimedEvent[]) => events.map((e) => e.event_id);
const parkedIds = (ledger: FakeLedger) => ledger.parked.map((p) => p.event.event_id);

Deno.test("outbox delivery: one poison event in the middle is parked alone, the rest ships in order", async () => {
  const events = Array.from({ length: 9 }, (_, i) => event(`r${i}`, 1));
  const poison = events[4];
  const sender = new FakeSender(refusing([poison]));
  const ledger = new FakeLedger();
  const d = delivery(sender, ledger);
  await d.deliver(events);

  assert.deepEqual(parkedIds(ledger), [poison.event_id]);
  assert.equal(ledger.parked[0].reason, "broker refused it: MESSAGE_TOO_LARGE");
  assert.equal(ledger.parked[0].follows, undefined);
  const rest = ids(events.filter((e) => e !== poison));
  assert.deepEqual(ledger.marked, rest, "the others are marked, in order");
  assert.deepEqual(sender.acked.flat(), rest, "and were acknowledged in that order, once each");
  // Found by halving: the poison was last sent alone, and it took few sends.
  assert.deepEqual(sender.calls.filter((c) => c.includes(poison.event_id)).at(-1), [
    poison.event_id,
  ]);
  assert.ok(sender.calls.length <= 2 * Math.ceil(Math.log2(events.length)) + 1, `${sender.calls}`);
  assert.equal(d.published, true);
  assert.deepEqual(d.parked.map((p) => p.event.event_id), [poison.event_id]);
});

Deno.test("outbox delivery: a batch without poison is one send, nothing parked", async () => {
  const events = [event("a", 1), event("a", 2), event("b", 1)];
  const sender = new FakeSender(() => "ack");
  const ledger = new FakeLedger();
  const d = delivery(sender, ledger);
  await d.deliver(events);
  assert.deepEqual(sender.calls, [ids(events)]);
  assert.deepEqual(ledger.marked, ids(events));
  assert.deepEqual(ledger.parked, []);
  assert.equal(d.published, true);
});

Deno.test("outbox delivery: a poison event's later events of its run are parked behind it, other runs ship", async () => {
  const [a1, a2, a3, a4] = [1, 2, 3, 4].map((s) => event("a", s));
  const [b1, b2] = [1, 2].map((s) => event("b", s));
  const events = [a1, a2, a3, a4, b1, b2];
  const sender = new FakeSender(refusing([a2]));
  const ledger = new FakeLedger();
  await delivery(sender, ledger).deliver(events);

  assert.deepEqual(parkedIds(ledger).sort(), ids([a2, a3, a4]).sort());
  const byId = new Map(ledger.parked.map((p) => [p.event.event_id, p]));
  assert.equal(byId.get(a2.event_id)!.follows, undefined);
  for (const e of [a3, a4]) {
    assert.equal(byId.get(e.event_id)!.follows, 2);
    assert.equal(byId.get(e.event_id)!.reason, "follows parked seq 2");
  }
  assert.deepEqual(ledger.marked, ids([a1, b1, b2]));
  assert.deepEqual(
    sender.acked.flat(),
    ids([a1, b1, b2]),
    "nothing of run a after a1 was acknowledged",
  );
});

Deno.test("outbox delivery: an event over maxBytes is parked without being sent, and its run's later events behind it", async () => {
  const big = event("a", 2, { payload: JSON.stringify({ blob: "x".repeat(3000) }) });
  const events = [event("a", 1), big, event("a", 3), event("b", 1)];
  const sender = new FakeSender(() => "ack");
  const ledger = new FakeLedger();
  await delivery(sender, ledger, { maxBytes: 2048 }).deliver(events);

  assert.ok(!sender.calls.flat().includes(big.event_id), "never sent");
  assert.ok(!sender.calls.flat().includes(events[2].event_id), "nor what follows it");
  assert.deepEqual(parkedIds(ledger), ids([big, events[2]]));
  assert.match(ledger.parked[0].reason, /^\d+ bytes exceeds EVENTS_MAX_MESSAGE_BYTES \(2048\)$/);
  assert.ok(ledger.parked[0].bytes! > 2048);
  assert.equal(ledger.parked[1].reason, "follows parked seq 2");
  assert.deepEqual(ledger.marked, ids([events[0], events[3]]));
});

Deno.test("outbox delivery: an event of a run parked in an earlier batch is parked behind it unsent", async () => {
  // The claim says seq 2 of run a is parked; seq 1 (below it) may still go.
  const events = [
    event("a", 1, { parked_seq: 2 }),
    event("a", 3, { parked_seq: 2 }),
    event("b", 1),
  ];
  const sender = new FakeSender(() => "ack");
  const ledger = new FakeLedger();
  await delivery(sender, ledger).deliver(events);
  assert.deepEqual(parkedIds(ledger), [events[1].event_id]);
  assert.equal(ledger.parked[0].follows, 2);
  assert.deepEqual(ledger.marked, ids([events[0], events[2]]));
  assert.ok(!sender.calls.flat().includes(events[1].event_id));
});

Deno.test("outbox delivery: a retryable failure is thrown, not parked, and the retry ships everything", async () => {
  const events = Array.from({ length: 5 }, (_, i) => event(`r${i}`, 1));
  let up = false;
  const sender = new FakeSender(() => up ? "ack" : "down");
  const ledger = new FakeLedger();
  const first = delivery(sender, ledger);
  await assert.rejects(first.deliver(events), /Producing messages failed/);
  assert.equal(sender.calls.length, 1, "not bisected: the broker is away, not refusing");
  assert.deepEqual(ledger.parked, []);
  assert.deepEqual(ledger.marked, []);
  assert.equal(first.published, false);

  // The publisher's loop retries the batch (claimed again) once the broker is back.
  up = true;
  const retry = delivery(sender, ledger);
  await retry.deliver(events);
  assert.deepEqual(ledger.parked, []);
  assert.deepEqual(ledger.marked, ids(events));
  assert.equal(retry.published, true);
});

Deno.test("outbox delivery: a retryable failure while bisecting stops there; nothing is parked for it", async () => {
  const events = Array.from({ length: 8 }, (_, i) => event(`r${i}`, 1));
  const poison = events[6];
  const refuse = refusing([poison]);
  // The broker refuses the whole batch, acknowledges the first half, then goes away.
  const sender = new FakeSender((sent, call) => call >= 2 ? "down" : refuse(sent));
  const ledger = new FakeLedger();
  await assert.rejects(delivery(sender, ledger).deliver(events), /Producing messages failed/);
  assert.deepEqual(ledger.parked, [], "the poison was never alone: not parked");
  assert.deepEqual(ledger.marked, ids(events.slice(0, 4)), "the acknowledged half stays marked");
});

Deno.test("outbox delivery: chunks go one after another; a later chunk's failure leaves it and the rest pending", async () => {
  const events = Array.from({ length: 6 }, (_, i) => event("a", i + 1));
  // Room for two of these events per send, not three.
  const chunkBytes = 2 * Math.max(...events.map((e) => recordBatchBytes(toMessage(e)))) + 1;
  let n = 0;
  const sender = new FakeSender(() => n++ === 1 ? "down" : "ack");
  const ledger = new FakeLedger();
  await assert.rejects(delivery(sender, ledger, { chunkBytes }).deliver(events));
  assert.equal(sender.calls.length, 2, "the third chunk is not sent after the second failed");
  assert.deepEqual(sender.calls, [ids(events.slice(0, 2)), ids(events.slice(2, 4))]);
  assert.deepEqual(ledger.marked, sender.calls[0], "only the acknowledged first chunk is marked");
  assert.deepEqual(ledger.parked, []);

  // All of them again, the broker acknowledging: several sends, in order.
  const sender2 = new FakeSender(() => "ack");
  const ledger2 = new FakeLedger();
  await delivery(sender2, ledger2, { chunkBytes }).deliver(events);
  assert.deepEqual(sender2.calls, [0, 2, 4].map((i) => ids(events.slice(i, i + 2))));
  assert.deepEqual(ledger2.marked, ids(events));
});

Deno.test("outbox delivery: any batch and poison set parks exactly the poison and what follows it per run, ships the rest in order", () => {
  const batch = fc.array(
    fc.record({ run: fc.integer({ min: 0, max: 5 }), poison: fc.boolean(), big: fc.boolean() }),
    { minLength: 1, maxLength: 40 },
  );
  return fc.assert(
    fc.asyncProperty(batch, fc.integer({ min: 300, max: 5000 }), async (spec, chunkBytes) => {
      // Ordered by (run, seq), as claimPendingEvents returns them.
      const seqs = new Map<number, number>();
      const made = spec.map((s) => {
        const seq = (seqs.get(s.run) ?? 0) + 1;
        seqs.set(s.run, seq);
        const payload = s.big ? JSON.stringify({ blob: "x".repeat(3000) }) : `{"n":${seq}}`;
        return { s, e: event(`r${s.run}`, seq, { payload }) };
      }).sort((x, y) => x.s.run - y.s.run || x.e.seq - y.e.seq);
      const events = made.map((m) => m.e);
      const sender = new FakeSender(refusing(made.filter((m) => m.s.poison).map((m) => m.e)));
      const ledger = new FakeLedger();
      await delivery(sender, ledger, { maxBytes: 2048, chunkBytes }).deliver(events);

      // Expected: a run's events from its first poison or big event on are parked.
      const stopped = new Map<string, number>();
      const expectParked: string[] = [];
      const expectShipped: string[] = [];
      for (const { s, e } of made) {
        const first = stopped.get(e.run_id);
        if (first !== undefined) expectParked.push(e.event_id);
        else if (s.poison || s.big) {
          stopped.set(e.run_id, e.seq);
          expectParked.push(e.event_id);
        } else expectShipped.push(e.event_id);
      }
      assert.deepEqual(parkedIds(ledger).sort(), expectParked.sort());
      assert.deepEqual(ledger.marked, expectShipped);
      assert.deepEqual(sender.acked.flat(), expectShipped);
      for (const p of ledger.parked) {
        const first = stopped.get(p.event.run_id)!;
        assert.equal(p.follows, p.event.seq === first ? undefined : first);
      }
    }),
    { seed: 4242, numRuns: 200 },
  );
});

Deno.test("outbox delivery: parked events are reported once each, the culprit as an error, the ones behind it as warnings", () => {
  const lines: { level: string; msg: string; event_id: string; reason: string }[] = [];
  const log = createLogger("test", "debug", (line) => lines.push(JSON.parse(line)));
  const culprit = event("a", 1);
  const behind = event("a", 2);
  const counts: number[] = [];
  reportParked(
    [
      { event: culprit, bytes: 10, reason: "broker refused it: MESSAGE_TOO_LARGE" },
      { event: behind, bytes: 10, reason: "follows parked seq 1", follows: 1 },
    ],
    log,
    (n) => counts.push(n),
  );
  assert.deepEqual(lines.map((l) => [l.level, l.event_id, l.reason]), [
    ["error", culprit.event_id, "broker refused it: MESSAGE_TOO_LARGE"],
    ["warn", behind.event_id, "follows parked seq 1"],
  ]);
  assert.match(lines[0].msg, /^event parked: it can never be published/);
  assert.equal(lines[1].msg, "event parked behind an earlier parked event of its run");
  assert.deepEqual(counts, [2]);

  reportParked([], log, (n) => counts.push(n));
  assert.equal(lines.length, 2, "nothing parked: no line");
  assert.deepEqual(counts, [2], "and no count");
});
