/**
 * kafka/assignment.ts: what each join assigned, under which membership, and
 * what it took away. Pure; no broker.
 *
 *   deno test -A tests/kafka_assignment_test.ts
 */
import assert from "node:assert/strict";
import { Assignment } from "../kafka/assignment.ts";

const join = (generationId: number | undefined, partitions: number[]) => ({
  generationId,
  memberId: "m",
  assignments: [{ topic: "t", partitions }],
});

Deno.test("assignment: nothing is known nor revoked before the first join", () => {
  const a = new Assignment();
  assert.equal(a.partitions, undefined);
  assert.equal(a.known, false);
  assert.equal(a.owns("t", 0), false);
  assert.deepEqual(a.lost(), []);
  assert.equal(a.member, undefined);
});

Deno.test("assignment: each join's difference from the one before is revoked; the membership follows", () => {
  const a = new Assignment();
  assert.deepEqual(a.joined(join(1, [0, 1, 2])), []);
  assert.deepEqual(a.member, { generationId: 1, memberId: "m" });
  assert.deepEqual(a.joined(join(2, [1, 3])), [
    { topic: "t", partition: 0 },
    { topic: "t", partition: 2 },
  ]);
  assert.deepEqual(a.member, { generationId: 2, memberId: "m" });
  assert.equal(a.owns("t", 3), true);
  assert.equal(a.owns("t", 0), false);
  assert.equal(a.ownsAnyOf(["t"]), true);
  assert.equal(a.ownsAnyOf(["u"]), false);
  // A join that did not say its generation leaves nothing to commit as.
  a.joined(join(undefined, [1]));
  assert.equal(a.member, undefined);
});

Deno.test("assignment: a lost membership revokes everything, and an empty join holds no membership", () => {
  const a = new Assignment();
  a.joined(join(1, [0, 1]));
  assert.deepEqual(a.lost(), [{ topic: "t", partition: 0 }, { topic: "t", partition: 1 }]);
  assert.deepEqual(a.partitions, []);
  assert.equal(a.member, undefined);
  assert.equal(a.known, true);
  assert.equal(a.ownsAnyOf(["t"]), false);
  a.joined({ generationId: 2, memberId: "m", assignments: [] });
  assert.equal(a.member, undefined);
});
