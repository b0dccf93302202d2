/**
 * The process guard for the Postgres driver: it contains a lost connection
 * raised by the driver and nothing else.
 *
 *   deno test -A tests/db_driver_guard_test.ts
 */
import assert from "node:assert/strict";
import client from "prom-client";
import postgres from "postgres";
import { guardDriverFaults, isDriverConnectionFault } from "../db/driver_guard.ts";
import { silentLogger } from "../core/log.ts";

const DRIVER_STACK =
  "\n    at nextWrite (file:///x/node_modules/postgres/src/connection.js:255:22)";

function withStack<T extends Error>(err: T, extra: string, code?: string): T {
  Object.defineProperty(err, "stack", { value: `${err.name}: ${err.message}${extra}` });
  if (code) Object.assign(err, { code });
  return err;
}

function postgresError(code: string): Error {
  return new postgres.PostgresError({ message: "m", code } as never);
}

Deno.test("driver guard: recognises a lost connection raised by the driver", () => {
  assert.ok(isDriverConnectionFault(postgresError("57P01")));
  assert.ok(isDriverConnectionFault(postgresError("57P03")));
  assert.ok(isDriverConnectionFault(postgresError("08006")));
  assert.ok(
    isDriverConnectionFault(
      withStack(new Error("write CONNECTION_CLOSED"), "", "CONNECTION_CLOSED"),
    ),
  );
  assert.ok(
    isDriverConnectionFault(withStack(new Error("read ECONNRESET"), DRIVER_STACK, "ECONNRESET")),
  );
  assert.ok(
    isDriverConnectionFault(
      withStack(new Error("This socket has been ended by the other party"), DRIVER_STACK, "EPIPE"),
    ),
  );
  assert.ok(
    isDriverConnectionFault(
      withStack(new TypeError("Cannot read properties of null (reading 'write')"), DRIVER_STACK),
    ),
  );
});

Deno.test("driver guard: leaves every other error alone", () => {
  assert.ok(!isDriverConnectionFault(postgresError("23505")), "a unique violation is a bug to see");
  assert.ok(
    !isDriverConnectionFault(postgresError("57014")),
    "a cancelled statement is not a lost connection",
  );
  assert.ok(
    !isDriverConnectionFault(withStack(new Error("read ECONNRESET"), "", "ECONNRESET")),
    "not the driver's socket",
  );
  assert.ok(
    !isDriverConnectionFault(new TypeError("Cannot read properties of null (reading 'write')")),
  );
  assert.ok(
    !isDriverConnectionFault(withStack(new TypeError("x is not a function"), DRIVER_STACK)),
  );
  assert.ok(!isDriverConnectionFault("57P01"));
  assert.ok(!isDriverConnectionFault(undefined));
});

Deno.test("driver guard: contains the driver's unhandled rejections and uncaught errors, counted; passes the rest on", async () => {
  const registry = new client.Registry();
  const uninstall = guardDriverFaults(silentLogger, registry);
  try {
    const dispatchRejection = (reason: unknown) => {
      const promise = Promise.reject(reason);
      promise.catch(() => {});
      const ev = new PromiseRejectionEvent("unhandledrejection", {
        promise,
        reason,
        cancelable: true,
      });
      globalThis.dispatchEvent(ev);
      return ev.defaultPrevented;
    };
    const dispatchError = (error: unknown) => {
      const ev = new ErrorEvent("error", { error, cancelable: true });
      globalThis.dispatchEvent(ev);
      return ev.defaultPrevented;
    };
    assert.equal(dispatchRejection(postgresError("57P01")), true);
    assert.equal(
      dispatchError(
        withStack(new TypeError("Cannot read properties of null (reading 'write')"), DRIVER_STACK),
      ),
      true,
    );
    assert.equal(dispatchRejection(new Error("a bug")), false);
    assert.equal(dispatchError(new TypeError("x is not a function")), false);
    const text = await registry.metrics();
    assert.match(text, /poimen_db_driver_faults_total\{kind="rejection"\} 1/);
    assert.match(text, /poimen_db_driver_faults_total\{kind="exception"\} 1/);
  } finally {
    uninstall();
  }
});
