/**
 * Concurrency limits of a workflow (`concurrency: { limit, key? }` in its
 * definition): the JSON Pointer `key` (RFC 6901) into a run's input names
 * the run's concurrency group, evaluated once, at admission, and stored on
 * the run. A group's key is the value's text: a string as it is, a number
 * or a boolean as JSON writes it; without `key`, every run of the tenant
 * and workflow is in one group, key `""`.
 */

/** The most runs of one group a limit may allow at once. */
export const MAX_CONCURRENCY_LIMIT = 100_000;
/** The longest key text a run may have (longer values are refused at admission). */
export const MAX_CONCURRENCY_KEY_LENGTH = 255;

/** `concurrency` of a workflow definition. */
export interface ConcurrencyLimit {
  /** At most this many runs running at once per group (1–100000). */
  limit: number;
  /** A JSON Pointer into the input (`/customer_id`); unset: one group per tenant. */
  key?: string;
}

/** A JSON Pointer (RFC 6901) of at least one segment. */
export const POINTER = /^(\/([^~/]|~[01])*)+$/;

/** Why `c` is not a valid limit, or undefined when it is. */
export function concurrencyProblem(c: unknown): string | undefined {
  if (typeof c !== "object" || c === null) return "concurrency must be { limit, key? }";
  const { limit, key, ...rest } = c as Record<string, unknown>;
  const extra = Object.keys(rest);
  if (extra.length > 0) return `concurrency has unknown field ${extra[0]}`;
  if (
    typeof limit !== "number" || !Number.isInteger(limit) || limit < 1 ||
    limit > MAX_CONCURRENCY_LIMIT
  ) {
    return `concurrency.limit must be an integer from 1 to ${MAX_CONCURRENCY_LIMIT}`;
  }
  if (key !== undefined && (typeof key !== "string" || !POINTER.test(key))) {
    return "concurrency.key must be a JSON Pointer into the input, like /customer_id";
  }
  return undefined;
}

/** The result of evaluating a key: the group's key text, or why the input has none. */
export type KeyOutcome = { key: string } | { problem: string };

/**
 * The concurrency key of `input` at `pointer` (undefined pointer: `""`).
 * The value must be a string, a number or a boolean, at most
 * MAX_CONCURRENCY_KEY_LENGTH characters as text.
 */
export function concurrencyKeyOf(input: unknown, pointer: string | null | undefined): KeyOutcome {
  return keyAtPointer(input, pointer, "concurrency");
}

/**
 * The key text of `input` at `pointer` (undefined pointer: `""`), for the
 * workflow's `what` key (`concurrency`, `debounce`): a string, a number or a
 * boolean, at most MAX_CONCURRENCY_KEY_LENGTH characters as text.
 */
export function keyAtPointer(
  input: unknown,
  pointer: string | null | undefined,
  what: string,
): KeyOutcome {
  if (pointer === null || pointer === undefined) return { key: "" };
  let at: unknown = input;
  for (const raw of pointer.split("/").slice(1)) {
    const segment = raw.replaceAll("~1", "/").replaceAll("~0", "~");
    if (Array.isArray(at) && /^(0|[1-9][0-9]*)$/.test(segment)) at = at[Number(segment)];
    else if (
      typeof at === "object" && at !== null && !Array.isArray(at) && Object.hasOwn(at, segment)
    ) {
      at = (at as Record<string, unknown>)[segment];
    } else at = undefined;
    if (at === undefined) break;
  }
  if (at === undefined || at === null) {
    return { problem: `is required: it is the workflow's ${what} key (${pointer})` };
  }
  if (typeof at !== "string" && typeof at !== "number" && typeof at !== "boolean") {
    return {
      problem: `must be a string, a number or a boolean: it is the workflow's ${what} key`,
    };
  }
  const key = typeof at === "string" ? at : JSON.stringify(at);
  if (key.length > MAX_CONCURRENCY_KEY_LENGTH) {
    return {
      problem: `is the workflow's ${what} key: at most ${MAX_CONCURRENCY_KEY_LENGTH} characters`,
    };
  }
  return { key };
}
