/**
 * The relay's per-partition state machine (relay/partition_state.ts), driven
 * by sequences of events with no Kafka, API or timer: what it starts, lets
 * go, completes and resumes from, and, over generated sequences, that
 * nothing is skipped, done twice or given back to the budget twice.
 *
 *   deno test -A tests/relay_partition_state_test.ts
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { type Job, type PartitionMessage, PartitionState } from "../relay/partition_state.ts";

function msg(offset: number, bytes = 10): PartitionMessage {
  return { offset: BigInt(offset), timestamp: 1000 + offset, value: new Uint8Array(bytes) };
}

function partition(maxInFlight: number): PartitionState {
  return new PartitionState("poimen.t.dispatch", 0, "t", maxInFlight);
}

const offsets = (jobs: Job[]) => jobs.map((j) => Number(j.m.offset));

/** Offers `0..n-1` and returns every job queued, by offset. */
function offerAll(p: PartitionState, n: number, started: Job[] = []): Job[] {
  const jobs: Job[] = [];
  for (let o = 0; o < n; o++) {
    const offered = p.offer(msg(o));
    assert.equal(offered.kind, "queued");
    if (offered.kind !== "queued") throw new Error("unreachable");
    jobs.push(offered.job);
    started.push(...offered.start);
  }
  return jobs;
}

Deno.test("partition state: at most maxInFlight run; a finished call starts the next", () => {
  const p = partition(2);
  const started: Job[] = [];
  const jobs = offerAll(p, 3, started);
  assert.deepEqual(offsets(started), [0, 1]);
  assert.equal(p.running, 2);
  assert.equal(p.queued, 1);
  const f = p.finished(jobs[0], "done");
  assert.deepEqual({ release: f.release, completed: f.completed }, {
    release: true,
    completed: true,
  });
  assert.deepEqual(offsets(f.start), [2]);
  assert.equal(f.resumeFrom, undefined);
  assert.equal(p.tracker.toCommit(), 1n);
});

Deno.test("partition state: commits only the done prefix, whatever order calls finish in", () => {
  const p = partition(3);
  const jobs = offerAll(p, 3);
  p.finished(jobs[2], "done");
  p.finished(jobs[1], "done");
  assert.equal(p.tracker.toCommit(), undefined, "offset 0 is not done");
  p.finished(jobs[0], "done");
  assert.equal(p.tracker.toCommit(), 3n);
});

Deno.test("partition state: a failure pauses behind it, lets the rest go, resumes once it is done", () => {
  const p = partition(3);
  const jobs = offerAll(p, 5); // 0, 1, 2 running; 3, 4 queued
  const paused = p.failed(jobs[1]);
  assert.ok(paused);
  assert.deepEqual(offsets(paused.letGo).sort(), [2, 3, 4]);
  assert.equal(paused.newlyPaused, true);
  assert.equal(paused.resumeFrom, 2n);
  assert.equal(p.resumeFrom, 2n);
  assert.ok(jobs[2].evicted && jobs[3].evicted && !jobs[0].evicted && !jobs[1].evicted);
  assert.ok(jobs.every((j) => !j.cancel.signal.aborted), "aborting is the relay's job");
  assert.equal(p.failed(jobs[1]), undefined, "a second failure changes nothing");
  assert.deepEqual(p.offer(msg(5)), { kind: "dropped" }, "handed out while paused");

  const late = p.finished(jobs[2], "done");
  assert.deepEqual(
    { release: late.release, completed: late.completed },
    { release: false, completed: false },
    "a let-go call's answer is ignored; its share was given back when let go",
  );
  const first = p.finished(jobs[0], "done");
  assert.equal(first.resumeFrom, undefined, "offset 1 still failing");
  const probe = p.finished(jobs[1], "done");
  assert.equal(probe.resumeFrom, 2n);
  assert.equal(probe.droppedWhilePaused, 1);
  assert.equal(p.resumeFrom, undefined);
  assert.equal(p.tracker.toCommit(), 2n, "never past what was let go");

  // The consumer hands it out again from 2.
  const again = p.offer(msg(2));
  assert.equal(again.kind, "queued");
  if (again.kind === "queued") assert.deepEqual(offsets(again.start), [2]);
});

Deno.test("partition state: a decided call after the failing one moves the cut past it", () => {
  const p = partition(4);
  const jobs = offerAll(p, 4);
  p.decided(jobs[2]);
  const paused = p.failed(jobs[0]);
  assert.ok(paused);
  assert.equal(paused.resumeFrom, 3n);
  assert.deepEqual(offsets(paused.letGo), [3], "1 is before the cut and keeps going");
  for (const j of [jobs[1], jobs[2]]) assert.equal(p.finished(j, "done").completed, true);
  assert.equal(p.finished(jobs[0], "done").resumeFrom, 3n);
  assert.equal(p.tracker.toCommit(), 3n);
});

Deno.test("partition state: done before the cut is not done a second time when it comes again", () => {
  const p = partition(3);
  const jobs = offerAll(p, 3);
  p.finished(jobs[2], "done"); // a fast dead letter, say
  const paused = p.failed(jobs[0]);
  assert.ok(paused);
  assert.deepEqual(offsets(paused.letGo), [1]);
  p.finished(jobs[1], "abandoned");
  assert.equal(p.finished(jobs[0], "done").resumeFrom, 1n);
  const one = p.offer(msg(1));
  assert.equal(one.kind, "queued");
  assert.deepEqual(p.offer(msg(2)), { kind: "done-ahead" });
  if (one.kind === "queued") p.finished(one.job, "done");
  assert.equal(p.tracker.toCommit(), 3n);
});

Deno.test("partition state: an earlier failure cuts further back; the later one is let go", () => {
  const p = partition(4);
  const jobs = offerAll(p, 4);
  assert.equal(p.failed(jobs[2])?.resumeFrom, 3n);
  const further = p.failed(jobs[0]);
  assert.ok(further);
  assert.equal(further.newlyPaused, false);
  assert.equal(further.resumeFrom, 1n);
  assert.deepEqual(offsets(further.letGo).sort(), [1, 2]);
  assert.equal(jobs[2].failing, false, "let go: it no longer holds the partition");
  p.finished(jobs[2], "abandoned");
  p.finished(jobs[1], "abandoned");
  assert.equal(p.finished(jobs[0], "done").resumeFrom, 1n);
});

Deno.test("partition state: a revoked partition lets go what is not decided and starts nothing", () => {
  const p = partition(2);
  const started: Job[] = [];
  const jobs = offerAll(p, 4, started); // 0, 1 running; 2, 3 queued
  p.decided(jobs[0]);
  p.failed(jobs[1]);
  const revoked = p.revoke();
  assert.equal(revoked.wasPaused, true);
  assert.equal(revoked.dropped, 0, "the pause had let the queue go already");
  assert.deepEqual(offsets(revoked.letGo), [1], "0 is decided; 1's retries stop");
  assert.ok(jobs[1].evicted && !jobs[1].failing && !jobs[0].evicted);
  assert.equal(p.resumeFrom, undefined);
  const f = p.finished(jobs[1], "abandoned");
  assert.equal(f.resumeFrom, undefined);
  assert.deepEqual(f.start, []);

  const q = partition(1);
  const qs = offerAll(q, 3);
  const r = q.revoke();
  assert.equal(r.dropped, 2);
  assert.deepEqual(offsets(r.letGo).sort(), [0, 1, 2]);
  assert.equal(q.finished(qs[0], "done").completed, false);
});

Deno.test("partition state: halted, it starts and resumes nothing; dropQueued gives the queue back", () => {
  const p = partition(1);
  const jobs = offerAll(p, 3);
  p.failed(jobs[0]);
  const q = partition(1);
  const qs = offerAll(q, 3);
  p.halt();
  q.halt();
  assert.equal(p.finished(jobs[0], "abandoned").resumeFrom, undefined);
  const f = q.finished(qs[0], "done");
  assert.deepEqual(f.start, [], "nothing new starts while stopping");
  assert.deepEqual(offsets(q.dropQueued()), [1, 2]);
  assert.equal(q.queued, 0);
});

Deno.test("partition state: offsets going backwards (topic recreated) start a new tracker", () => {
  const p = partition(2);
  const jobs = offerAll(p, 2);
  const old = p.tracker;
  const again = p.offer(msg(0));
  assert.equal(again.kind, "queued");
  if (again.kind !== "queued") return;
  assert.equal(again.retrackedAfter, 1n);
  assert.notEqual(p.tracker, old);
  p.finished(jobs[0], "done");
  assert.equal(old.toCommit(), 1n, "the old call completes in the tracker it holds");
  assert.equal(p.tracker.toCommit(), undefined);
});

// ------------------------------------------------------------ generated sequences

type Step =
  | { op: "offer" }
  | { op: "fail" | "finish" | "decide"; pick: number; done: boolean };

const step: fc.Arbitrary<Step> = fc.oneof(
  { weight: 3, arbitrary: fc.constant({ op: "offer" } as const) },
  fc.record({
    op: fc.constantFrom("fail", "finish", "decide"),
    pick: fc.nat(),
    done: fc.boolean(),
  }),
);

Deno.test("partition state: generated sequences skip nothing and do nothing twice", () => {
  const END = 40;
  fc.assert(
    fc.property(
      fc.integer({ min: 1, max: 5 }),
      fc.array(step, { maxLength: 300 }),
      (max, steps) => {
        const p = partition(max);
        // The consumer: hands out from `next` on, again from where the partition resumes.
        let next = 0;
        const running = new Set<Job>();
        const released = new Map<Job, number>();
        const all: Job[] = [];
        // Offsets whose call completed them (admitted or dead-lettered), and how often.
        const completed = new Map<bigint, number>();
        const give = (j: Job) => released.set(j, (released.get(j) ?? 0) + 1);
        const start = (jobs: Job[]) => {
          for (const j of jobs) {
            assert.ok(!running.has(j) && !j.evicted, "started once, never when let go");
            assert.equal(p.resumeFrom, undefined, "nothing starts while paused");
            running.add(j);
          }
          assert.ok(running.size <= max);
        };
        const offer = () => {
          if (next >= END) return;
          const offered = p.offer(msg(next++));
          if (offered.kind === "done-ahead") {
            assert.ok(completed.has(BigInt(next - 1)), "done ahead only what was done");
          } else if (offered.kind === "queued") {
            all.push(offered.job);
            start(offered.start);
          }
        };
        const finish = (j: Job, done: boolean) => {
          running.delete(j);
          // As the relay does: a let-go call ends abandoned or not, a decided one done.
          if (!j.evicted && !j.finishing) p.decided(j);
          const f = p.finished(j, j.evicted ? (done ? "done" : "abandoned") : "done");
          if (f.release) give(j);
          if (f.completed) completed.set(j.m.offset, (completed.get(j.m.offset) ?? 0) + 1);
          if (f.resumeFrom !== undefined) next = Number(f.resumeFrom);
          start(f.start);
        };
        for (const s of steps) {
          if (s.op === "offer") {
            offer();
            continue;
          }
          const live = [...running];
          if (live.length === 0) continue;
          const j = live[s.pick % live.length];
          if (s.op === "finish") finish(j, s.done);
          else if (s.op === "decide" && !j.evicted) p.decided(j);
          else if (s.op === "fail" && !j.evicted && !j.finishing) {
            const paused = p.failed(j);
            // A let-go call still runs (it ends later); a let-go queued one never starts.
            for (const g of paused?.letGo ?? []) give(g);
          }
        }
        // Drain: every call ends, the consumer hands out everything up to the end.
        for (let guard = 0; (running.size > 0 || next < END) && guard < 10_000; guard++) {
          const [j] = running;
          if (j) finish(j, false);
          else offer();
        }
        assert.equal(running.size, 0);
        assert.equal(p.queued, 0);
        assert.equal(p.tracker.toCommit(), BigInt(END), "nothing skipped: committable to the end");
        for (const [offset, n] of completed) assert.equal(n, 1, `offset ${offset} done ${n} times`);
        for (const j of all) assert.equal(released.get(j), 1, "each share given back once");
      },
    ),
    { seed: 4242, numRuns: 500 },
  );
});
