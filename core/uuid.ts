/**
 * Run ids: UUIDv7 (RFC 9562), 48 bits of Unix milliseconds first. Inserts
 * land at the right edge of the primary-key index (v4 scatters them across
 * it), and ordering by run_id is ordering by admission, which keyset
 * pagination relies on. The `uuid` package's `v7()` keeps that order within
 * one millisecond (a counter after the timestamp, RFC 9562 method 1) and
 * when the clock steps back; an id built from the clock and random bits
 * alone would not.
 */
import { v7 } from "uuid";

/** A new run id: greater than every id this process made before. */
export function newRunId(): string {
  return v7();
}

/**
 * A UUID as poimen writes it: lowercase, hyphenated. Ours rather than the
 * package's `validate`, which also takes uppercase ids: a run id or cursor
 * in another spelling than the one we hand out is not one of ours.
 */
export const UUID_PATTERN = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The smallest UUIDv7 of millisecond `ms`: every run id made at or after `ms` is not less. */
export function uuidv7Floor(ms: number): string {
  const hex = Math.max(0, Math.floor(ms)).toString(16).padStart(12, "0").slice(-12);
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-7000-8000-000000000000`;
}
