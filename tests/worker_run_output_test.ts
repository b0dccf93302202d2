/** What a worker may write as a run's result or error (worker/run_output.ts). */
import assert from "node:assert/strict";
import { boundError, encodeResult, utf8Bytes } from "../worker/run_output.ts";

/** The error a result fails its attempt with, if any. */
const checkResult = (result: unknown, maxBytes: number) => encodeResult(result, maxBytes).error;

Deno.test("run output: a result that can be stored is its JSON text, undefined as null", () => {
  assert.deepEqual(encodeResult({ a: [1, "é"], b: undefined }, 1024), { json: '{"a":[1,"é"]}' });
  assert.deepEqual(encodeResult(undefined, 1024), { json: "null" });
  assert.deepEqual(encodeResult({ toJSON: () => "x" }, 1024), { json: '"x"' });
  // Escapes that only look like a NUL or a lone surrogate: a backslash, then text.
  for (const s of ["\\u0000", "\\ud800", "a\\\\u0000", "\u0001", "😀"]) {
    assert.deepEqual(encodeResult({ s }, 1024), { json: JSON.stringify({ s }) }, JSON.stringify(s));
  }
  // Exactly at the limit, in UTF-8 bytes (é is two).
  assert.equal(encodeResult("é".repeat(10), 22).json, JSON.stringify("é".repeat(10)));
  assert.equal(encodeResult("é".repeat(10), 21).error?.code, "result-too-large");
});

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
  assert.equal(checkResult(10n, 1024)?.code, "bad-result");
  // JSON.stringify has no text for these at all.
  assert.equal(checkResult(() => 1, 1024)?.code, "bad-result");
  assert.equal(checkResult(Symbol("s"), 1024)?.code, "bad-result");
  assert.equal(checkResult({ toJSON: () => undefined }, 1024)?.code, "bad-result");
  // After an even run of backslashes, the escape is a real NUL.
  assert.match(checkResult({ k: ["\\\0"] }, 1024)!.message, /\$\.k\[0\]/);
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
