/**
 * A last line of defence for the processes that hold a Postgres pool (api,
 * worker, outbox): an error the driver raises from one of its own callbacks
 * (a timer, a socket event, a promise it never hands out) has no caller to
 * reach, and an uncaught error or unhandled rejection ends a Deno process.
 *
 * The known paths of that kind are fixed in the vendored driver
 * (vendor/postgres, see its PATCHES.md); this guard is for the ones not yet
 * known. It swallows only what is recognisably a dropped Postgres connection
 * raised by the driver (its error class and code, or a socket error with the
 * driver's source in the stack), logs one warn line and counts it; anything
 * else still ends the process as before. The pool itself recovers: the next
 * statement opens a new connection.
 */
import client from "prom-client";
import type { Logger } from "../core/log.ts";

// Connection-level SQLSTATEs: connection exceptions (08…), and the backend
// being terminated or the server shutting down or starting (57P01–57P03).
const LOST_SQLSTATE = /^(08...|57P0[123])$/;
// postgres.js' own codes for a connection that closed, ended or never opened.
const DRIVER_CODES = new Set([
  "CONNECTION_CLOSED",
  "CONNECTION_ENDED",
  "CONNECTION_DESTROYED",
  "CONNECT_TIMEOUT",
]);
// A socket's, which the Kafka client's sockets raise too: only with the driver in the stack.
const SOCKET_CODES = new Set(["ECONNRESET", "EPIPE", "ECONNREFUSED", "ETIMEDOUT"]);
// The driver's source, vendored or from the npm cache: .../postgres/src/x.js
const DRIVER_FRAME = /[\\/]postgres[\\/]src[\\/][a-z]+\.js/;
// An unpatched driver's write to a socket that closed meanwhile.
const NULL_SOCKET_WRITE = /^Cannot read properties of null \(reading 'write'\)$/;

/** Whether `err` is a lost Postgres connection raised by the driver, with no other meaning. */
export function isDriverConnectionFault(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const code = String((err as { code?: unknown }).code ?? "");
  if (err.name === "PostgresError") return LOST_SQLSTATE.test(code);
  if (DRIVER_CODES.has(code)) return true;
  if (!DRIVER_FRAME.test(err.stack ?? "")) return false;
  if (SOCKET_CODES.has(code)) return true;
  return err instanceof TypeError && NULL_SOCKET_WRITE.test(err.message);
}

/**
 * Installs the guard for this process: `poimen_db_driver_faults_total` on
 * `registry` counts what it contained. Returns the uninstaller (for tests).
 */
export function guardDriverFaults(log: Logger, registry: client.Registry): () => void {
  const contained = new client.Counter({
    name: "poimen_db_driver_faults_total",
    help:
      "Errors of a lost Postgres connection raised inside the driver with no caller to take them",
    labelNames: ["kind"] as const,
    registers: [registry],
  });
  const contain = (kind: "rejection" | "exception", err: unknown, ev: Event) => {
    if (!isDriverConnectionFault(err)) return;
    ev.preventDefault();
    contained.inc({ kind });
    log.warn("postgres driver fault contained; the pool reconnects", { kind, error: err });
  };
  const onRejection = (ev: PromiseRejectionEvent) => contain("rejection", ev.reason, ev);
  const onError = (ev: ErrorEvent) => contain("exception", ev.error, ev);
  globalThis.addEventListener("unhandledrejection", onRejection);
  globalThis.addEventListener("error", onError);
  return () => {
    globalThis.removeEventListener("unhandledrejection", onRejection);
    globalThis.removeEventListener("error", onError);
    registry.removeSingleMetric("poimen_db_driver_faults_total");
  };
}
