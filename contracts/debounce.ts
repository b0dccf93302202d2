/**
 * Debounce of a workflow (`debounce: { key?, period, maxWait }` in its
 * definition, milliseconds): the requests for one debounce key make one run,
 * started `period` after the last of them, and never later than `maxWait`
 * after the first. The key is a JSON Pointer into the input, evaluated at
 * admission as concurrency keys are (contracts/concurrency.ts
 * `keyAtPointer`); without `key`, every run of the tenant and version is in
 * one burst, key `""`.
 */
import { POINTER } from "./concurrency.ts";

/** The longest period or maxWait a definition may declare: 7 days. */
export const MAX_DEBOUNCE_MS = 7 * 24 * 60 * 60 * 1000;

/** `debounce` of a workflow definition. */
export interface DebounceOptions {
  /** A JSON Pointer into the input (`/customer_id`); unset: one burst per tenant. */
  key?: string;
  /** Milliseconds after the last request of a burst that its run starts (1 ms – 7 days). */
  period: number;
  /** Milliseconds after the first request of a burst that its run starts at the latest (≥ period). */
  maxWait: number;
}

/** Why `d` is not a valid debounce, or undefined when it is. */
export function debounceProblem(d: unknown): string | undefined {
  if (typeof d !== "object" || d === null) return "debounce must be { key?, period, maxWait }";
  const { key, period, maxWait, ...rest } = d as Record<string, unknown>;
  const extra = Object.keys(rest);
  if (extra.length > 0) return `debounce has unknown field ${extra[0]}`;
  const ms = (v: unknown) =>
    typeof v === "number" && Number.isInteger(v) && v >= 1 && v <= MAX_DEBOUNCE_MS;
  if (!ms(period)) {
    return `debounce.period must be an integer of milliseconds from 1 to ${MAX_DEBOUNCE_MS}`;
  }
  if (!ms(maxWait) || (maxWait as number) < (period as number)) {
    return `debounce.maxWait must be an integer of milliseconds from period to ${MAX_DEBOUNCE_MS}`;
  }
  if (key !== undefined && (typeof key !== "string" || !POINTER.test(key))) {
    return "debounce.key must be a JSON Pointer into the input, like /customer_id";
  }
  return undefined;
}
