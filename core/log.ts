/**
 * A structured logger: one JSON object per line on stderr, with fixed keys
 * (`tenant`, `run_id`, `topic`, `partition`, `offset`, …) so logs can be
 * queried. Passed in to every part; nothing else writes to the console.
 */

import { nextCause } from "./errors.ts";

export type Level = "debug" | "info" | "warn" | "error";
/** A line's structured fields, besides its message (`tenant`, `run_id`, `version`, …). */
export type Fields = Record<string, unknown>;

/** Where a part writes its log lines; any object of this shape will do. */
export interface Logger {
  /** Detail for debugging, off by default. */
  debug(msg: string, fields?: Fields): void;
  /** Something that happened as it should (a migration applied, a process started). */
  info(msg: string, fields?: Fields): void;
  /** Something wrong that the part recovers from by itself. */
  warn(msg: string, fields?: Fields): void;
  /** Something wrong that needs a person. */
  error(msg: string, fields?: Fields): void;
  /** A logger whose lines all carry `fields`. */
  with(fields: Fields): Logger;
}

const ORDER: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };

// Keys whose values are never written, whatever part logs them, at any depth.
const SECRET_KEYS = /authorization|token|password|secret/i;
// The password in `scheme://user:password@host`: a DATABASE_URL can reach a
// log inside an error message or a config echo, not only under a secret key.
const URL_PASSWORD = /(\b[a-z][a-z0-9+.-]*:\/\/[^\s:/@]*:)[^\s/@]*@/gi;

// How many causes deep an error is written: a cycle or a library's long
// chain must not make a line of any length.
const MAX_CAUSES = 6;

/**
 * An error as it is written, once for every part: its name, message, poimen
 * code and `retryable` when it has them, and its cause chain (an
 * AggregateError's last error standing for its cause, as the Kafka library
 * reports the attempt that failed last). Never the stack.
 */
function serializeError(error: Error, depth: number): Fields {
  const out: Fields = { name: error.name, message: redact(error.message) };
  const { code, retryable } = error as { code?: unknown; retryable?: unknown };
  if (typeof code === "string" || typeof code === "number") out.code = code;
  if (typeof retryable === "boolean") out.retryable = retryable;
  const cause = nextCause(error);
  if (cause !== undefined && depth < MAX_CAUSES) {
    out.cause = cause instanceof Error ? serializeError(cause, depth + 1) : redact(cause);
  }
  return out;
}

/** `value` as it may be written: secrets replaced, errors serialised (`serializeError`). */
function redact(value: unknown, parents: object[] = []): unknown {
  if (typeof value === "string") return value.replace(URL_PASSWORD, "$1[redacted]@");
  if (value instanceof Error) return serializeError(value, 0);
  if (typeof value !== "object" || value === null) return value;
  if (parents.includes(value)) return "[circular]";
  // Whatever JSON.stringify would write instead (a URL's href, a Date's ISO string).
  const toJSON = (value as { toJSON?: unknown }).toJSON;
  if (typeof toJSON === "function") return redact(toJSON.call(value), parents);
  const inner = [...parents, value];
  if (Array.isArray(value)) return value.map((v) => redact(v, inner));
  const out: Fields = {};
  for (const [k, v] of Object.entries(value)) {
    out[k] = SECRET_KEYS.test(k) ? "[redacted]" : redact(v, inner);
  }
  return out;
}

/** Creates a logger for process `service` that writes lines at `level` and above. */
export function createLogger(
  service: string,
  level: Level = "info",
  write: (line: string) => void = (line) => console.error(line),
  base: Fields = {},
): Logger {
  const emit = (lvl: Level, msg: string, fields?: Fields) => {
    if (ORDER[lvl] < ORDER[level]) return;
    write(JSON.stringify({
      time: new Date().toISOString(),
      level: lvl,
      service,
      msg,
      ...redact({ ...base, ...fields }) as Fields,
    }));
  };
  return {
    debug: (m, f) => emit("debug", m, f),
    info: (m, f) => emit("info", m, f),
    warn: (m, f) => emit("warn", m, f),
    error: (m, f) => emit("error", m, f),
    with: (f) => createLogger(service, level, write, { ...base, ...f }),
  };
}

/** A logger that drops everything (tests that don't look at logs). */
export const silentLogger: Logger = createLogger("silent", "error", () => {});
