/**
 * core/log.ts: one JSON object per line with fixed keys, and secrets never
 * written, wherever in the fields they sit. Each case checks the written
 * line, not the logger's internals: the secret's text must not appear.
 */
import assert from "node:assert/strict";
import { PoimenError } from "../core/errors.ts";
import { createLogger, type Fields, type Level, type Logger } from "../core/log.ts";

const SECRET = "s3cr3t-7f9a41";

/** The lines a logger at `level` writes for `fn`, as written and parsed. */
function capture(fn: (log: Logger) => void, level: Level = "debug") {
  const lines: string[] = [];
  fn(createLogger("test", level, (line) => lines.push(line)));
  return { lines, parsed: lines.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

/** Logs `fields` once and asserts the secret appears nowhere in the line. */
function logged(fields: Fields): Record<string, unknown> {
  const { lines, parsed } = capture((log) => log.info("m", fields));
  assert.equal(lines.length, 1);
  assert.ok(!lines[0].includes(SECRET), `secret written: ${lines[0]}`);
  return parsed[0];
}

Deno.test("log: a line is one JSON object with time, level, service, msg and the fields", () => {
  const { lines, parsed } = capture((log) =>
    log.warn("kafka unavailable", { tenant: "acme", partition: 2 })
  );
  assert.equal(lines.length, 1);
  assert.ok(!lines[0].includes("\n"));
  const { time, ...rest } = parsed[0];
  assert.ok(!Number.isNaN(Date.parse(String(time))), `time: ${time}`);
  assert.deepEqual(rest, {
    level: "warn",
    service: "test",
    msg: "kafka unavailable",
    tenant: "acme",
    partition: 2,
  });
});

Deno.test("log: lines below the level are not written", () => {
  const { parsed } = capture((log) => {
    log.debug("d");
    log.info("i");
    log.warn("w");
    log.error("e");
  }, "warn");
  assert.deepEqual(parsed.map((p) => p.msg), ["w", "e"]);
});

Deno.test("log: fields named like a secret are redacted, whatever their case", () => {
  const line = logged({
    authorization: `Bearer ${SECRET}`,
    Authorization: `Bearer ${SECRET}`,
    RELAY_TOKEN: SECRET,
    serviceToken: SECRET,
    db_password: SECRET,
    clientSecret: SECRET,
    tenant: "acme",
  });
  assert.equal(line.authorization, "[redacted]");
  assert.equal(line.RELAY_TOKEN, "[redacted]");
  assert.equal(line.db_password, "[redacted]");
  assert.equal(line.tenant, "acme", "other fields are kept");
});

Deno.test("log: secrets in the fields of a child logger (with) are redacted too", () => {
  const { lines } = capture((log) =>
    log.with({ token: SECRET, tenant: "acme" }).info("m", { run_id: "r1" })
  );
  assert.ok(!lines[0].includes(SECRET), lines[0]);
  assert.equal(JSON.parse(lines[0]).tenant, "acme");
  assert.equal(JSON.parse(lines[0]).run_id, "r1");
});

Deno.test("log: secrets nested in objects and arrays are redacted", () => {
  const line = logged({
    request: { method: "POST", headers: { Authorization: `Bearer ${SECRET}` } },
    attempts: [{ password: SECRET, n: 1 }],
  });
  assert.deepEqual(line.request, { method: "POST", headers: { Authorization: "[redacted]" } });
  assert.deepEqual(line.attempts, [{ password: "[redacted]", n: 1 }]);
});

Deno.test("log: the password of a URL is redacted wherever the URL appears", () => {
  const line = logged({
    url: `postgres://poimen:${SECRET}@db.internal:5432/poimen`,
    error: new Error(`connect to postgres://poimen:${SECRET}@db.internal/poimen failed`),
    target: new URL(`postgres://poimen:${SECRET}@db.internal/poimen`),
  });
  assert.equal(line.url, "postgres://poimen:[redacted]@db.internal:5432/poimen");
  assert.equal(
    (line.error as Record<string, unknown>).message,
    "connect to postgres://poimen:[redacted]@db.internal/poimen failed",
  );
  assert.equal(line.target, "postgres://poimen:[redacted]@db.internal/poimen");
});

Deno.test("log: an error is written as its name and message, without the stack", () => {
  const line = logged({ error: new Error("boom") });
  assert.deepEqual(line.error, { name: "Error", message: "boom" });
});

Deno.test("log: an error's code, retryable flag and cause chain are written, bounded", () => {
  const root = Object.assign(new Error("ECONNREFUSED 127.0.0.1:9092"), { code: "ECONNREFUSED" });
  const aggregate = new AggregateError([new Error("first try"), root], "all brokers failed");
  const line = logged({
    error: new PoimenError("database-unavailable", "could not admit", { cause: aggregate }),
  });
  assert.deepEqual(line.error, {
    name: "PoimenError",
    message: "could not admit",
    code: "database-unavailable",
    retryable: true,
    cause: {
      name: "AggregateError",
      message: "all brokers failed",
      cause: { name: "Error", message: "ECONNREFUSED 127.0.0.1:9092", code: "ECONNREFUSED" },
    },
  });
  let deep: Error = new Error("bottom");
  for (let i = 0; i < 20; i++) deep = new Error(`level ${i}`, { cause: deep });
  const text = JSON.stringify(logged({ error: deep }).error);
  assert.equal(text.match(/"message"/g)?.length, 7, "the error and six causes");
});

Deno.test("log: a field that refers to itself is written, not a crash", () => {
  const loop: Record<string, unknown> = { name: "loop" };
  loop.self = loop;
  const line = logged({ loop });
  assert.equal((line.loop as Record<string, unknown>).name, "loop");
});
