/**
 * What a worker may write as a run's result or error. Both are stored as
 * jsonb and travel in the run's terminal event (`run.succeeded` carries the
 * result, `run.failed` and `run.retrying` the error), so both are bounded by
 * `RUN_RESULT_MAX_BYTES`: an event poimen writes stays far below the events
 * topic's message limit and never blocks the outbox.
 *
 * Sizes are the UTF-8 bytes of the value as JSON (`JSON.stringify`), which
 * is how the API and the outbox send it on.
 */
import type { ErrorCode } from "../core/errors.ts";
import type { AttemptError } from "../db/attempt_end.ts";

/** Default of `RUN_RESULT_MAX_BYTES`: 256 KiB. */
export const DEFAULT_RUN_RESULT_MAX_BYTES = 256 * 1024;

const encoder = new TextEncoder();

/** UTF-8 length of a string. */
export function utf8Bytes(s: string): number {
  return encoder.encode(s).length;
}

/** A failure poimen itself decides, under a code from the one error table. */
export function attemptError(
  code: ErrorCode,
  message: string,
  extra: Record<string, unknown> = {},
): AttemptError {
  return { code, message, ...extra };
}

/** A handler's result as it is written (its JSON text), or why it cannot be. */
export type EncodedResult =
  | { json: string; error?: undefined }
  | { json?: undefined; error: AttemptError };

// The only way JSON.stringify writes a NUL or an unpaired surrogate (ES2019
// well-formed stringify, lowercase hex); valid pairs are written as they
// are. An escape counts only after an even run of backslashes: `\\u0000`
// is a backslash followed by "u0000", which jsonb stores.
const UNSTORABLE_ESCAPE = /(?<!\\)(?:\\\\)*\\u(?:0000|d[89a-f][0-9a-f]{2})/;

/**
 * Turns a handler's result into the JSON text that is written, once: the
 * size check, the storability check and the write all use this one string
 * (undefined is written as null). Or the error that fails the attempt; both
 * failures are final (not retried): the same input gives the same result again.
 * - `bad-result`: not JSON (a cycle, a BigInt, a function), or holds a
 *   string Postgres jsonb cannot store (a NUL character, an unpaired
 *   surrogate), which would otherwise fail the finishing write itself and
 *   leave the run to expire its lease, attempt after attempt;
 * - `result-too-large`: its JSON is over `maxBytes`.
 */
export function encodeResult(result: unknown, maxBytes: number): EncodedResult {
  let json: string | undefined;
  try {
    json = JSON.stringify(result ?? null);
  } catch (err) {
    return { error: attemptError("bad-result", `result is not JSON: ${errorMessage(err)}`) };
  }
  if (json === undefined) {
    return {
      error: attemptError(
        "bad-result",
        `result is not JSON: JSON.stringify gives nothing for this ${typeof result}`,
      ),
    };
  }
  const bytes = utf8Bytes(json);
  if (bytes > maxBytes) {
    return {
      error: attemptError(
        "result-too-large",
        `result is ${bytes} bytes as JSON, over RUN_RESULT_MAX_BYTES (${maxBytes})`,
        { bytes, limit: maxBytes },
      ),
    };
  }
  if (json.includes("\\u") && UNSTORABLE_ESCAPE.test(json)) {
    // Only a result that is refused is parsed: to say where the string is.
    const at = unstorableString(JSON.parse(json)) ?? "$";
    return {
      error: attemptError(
        "bad-result",
        `result ${at} holds a NUL character or an unpaired surrogate, which Postgres cannot store`,
      ),
    };
  }
  return { json };
}

/**
 * Makes an attempt's error storable and at most `maxBytes` as JSON: strings
 * Postgres cannot store get U+FFFD in place of the offending characters, and
 * an error still too large keeps its code and name with its message cut to
 * fit, marked `truncated` with its original size. Errors come from handlers
 * (any exception's message) and must always be recordable: an error that
 * cannot be written would leave the run running until its lease expires.
 */
export function boundError(error: AttemptError, maxBytes: number): AttemptError {
  const clean = storable(JSON.parse(JSON.stringify(error))) as AttemptError;
  const bytes = utf8Bytes(JSON.stringify(clean));
  if (bytes <= maxBytes) return clean;
  const head: AttemptError = { message: "" };
  if (typeof clean.code === "string") head.code = clean.code.slice(0, 100);
  if (typeof clean.name === "string") head.name = clean.name.slice(0, 100);
  head.truncated = true;
  head.bytes = bytes;
  let message = String(clean.message ?? "");
  for (;;) {
    const candidate = { ...head, message };
    if (utf8Bytes(JSON.stringify(candidate)) <= maxBytes || message.length === 0) {
      return candidate;
    }
    // Keep the share of the message that fits, then measure again: escapes
    // and multi-byte characters make characters and bytes differ.
    const over = utf8Bytes(JSON.stringify(candidate)) - maxBytes;
    const messageBytes = utf8Bytes(JSON.stringify(message));
    const keep = Math.floor(message.length * Math.max(0, messageBytes - over) / messageBytes);
    message = message.slice(0, Math.min(message.length - 1, keep));
    // Never split a surrogate pair: that half would not be storable.
    if (/[\uD800-\uDBFF]$/.test(message)) message = message.slice(0, -1);
  }
}

// The path of the first string (or key) that jsonb would refuse, if any.
function unstorableString(value: unknown, path = "$"): string | undefined {
  if (typeof value === "string") return isStorable(value) ? undefined : path;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const bad = unstorableString(value[i], `${path}[${i}]`);
      if (bad !== undefined) return bad;
    }
    return undefined;
  }
  if (value !== null && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) {
      if (!isStorable(k)) return `${path} key`;
      const bad = unstorableString(v, `${path}.${k}`);
      if (bad !== undefined) return bad;
    }
  }
  return undefined;
}

function isStorable(s: string): boolean {
  return !s.includes("\0") && s.isWellFormed();
}

function storable(value: unknown): unknown {
  if (typeof value === "string") return isStorable(value) ? value : fix(value);
  if (Array.isArray(value)) return value.map(storable);
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [fix(k), storable(v)]));
  }
  return value;
}

function fix(s: string): string {
  return s.replaceAll("\0", "\uFFFD").toWellFormed();
}

/** The message of anything thrown. */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
