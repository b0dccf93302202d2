/** What a worker may write as a run's result or error (worker/run_output.ts). */
import assert from "node:assert/strict";
import { boundError, checkResult, utf8Bytes } from "../worker/run_output.ts";

Deno.test("run output: a result within the limit passes, one over it is result-too-large with its size", () => {
  assert.equal(checkResult({ a: "x".repeat(100) }, 1024), undefined);
  assert.equal(checkResult(undefined, 1024), undefined);
  const big = Array.from({ length: 1000 }, () => 1e20);
  const err = checkResult(big, 1024);
  assert.equal(err?.code, "result-too-large");
  assert.equal(err?.bytes, JSON.stringify(big).length);
  assert.equal(err?.limit, 1024);
});

Deno.test("run output: a result Postgres cannot store (NUL, unpaired surrogate, cycle) is bad-result", () => {
  assert.equal(checkResult({ a: ["ok", "nul\0"] }, 1024)?.code, "bad-result");
  assert.match(checkResult({ a: ["ok", "nul\0"] }, 1024)!.message, /\$\.a\[1\]/);
  assert.equal(checkResult({ "\ud800": 1 }, 1024)?.code, "bad-result");
  assert.equal(checkResult("\udc00", 1024)?.code, "bad-result");
  assert.equal(checkResult("😀", 1024), undefined);
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  assert.equal(checkResult(cyclic, 1024)?.code, "bad-result");
});

Deno.test("run output: an error is made storable and cut to the limit, keeping code and name", () => {
  const small = boundError({ message: "a\0b\ud800", code: "validation" }, 1024);
  assert.deepEqual(small, { message: "a\uFFFDb\uFFFD", code: "validation" });
  for (const ch of ["x", "é", "😀", "\n", "\u0001"]) {
    const message = ch.repeat(50_000);
    const e = boundError({ message, name: "Error", issues: [1, 2, 3] }, 4096);
    assert.ok(utf8Bytes(JSON.stringify(e)) <= 4096, `${JSON.stringify(ch)} fits`);
    assert.ok(utf8Bytes(JSON.stringify(e)) > 3000, `${JSON.stringify(ch)} is not cut to nothing`);
    assert.equal(e.name, "Error");
    assert.equal(e.truncated, true);
    assert.ok(message.startsWith(e.message));
    assert.ok(e.message.isWellFormed());
  }
});
