/**
 * Batch admission (`POST /v1/runs` with an array): what
 * `PoimenClient.admitRuns` does. One request for up to
 * `RUN_BATCH_MAX_ITEMS` runs, answered with one result per item, in order:
 * each item is admitted, replayed or refused exactly as it would be alone,
 * so one bad item never fails the others.
 *
 * A batch in which every item has a `dispatch_key` (given, or generated
 * with `{ idempotent: true }`, once per call) is retried on network
 * errors, 408, 429 and 5xx, and still makes at most one run per key; with a
 * keyless item, only answers that say nothing was admitted (408, 429, 503)
 * are. An item's own problem (its `retryable` says whether sending it again
 * may help) is its result, never a rejection.
 *
 * ```ts
 * import { PoimenClient } from "@poimen/poimen/client";
 *
 * const poimen = new PoimenClient({ url, token });
 * const results = await poimen.admitRuns(orders.map((o) => ({
 *   workflow_ref: "invoice", input: o, dispatch_key: `invoice:${o.id}`,
 * })));
 * const refused = results.filter((r) => r.outcome === "problem");
 * ```
 *
 * @module
 */
import {
  RUN_BATCH_MAX_ITEMS,
  type RunBatchAnswer,
  type RunBatchResult,
  type RunRequest,
} from "../contracts/wire.ts";
import {
  type ApiAnswer,
  type PoimenNetworkError,
  PoimenProblem,
  refusedForNow,
} from "./problems.ts";
import { type RequestOptions, transient } from "./retry.ts";

export { RUN_BATCH_MAX_ITEMS };
export type { RunBatchAnswer, RunBatchResult };

/** How `admitRuns` sends a batch. */
export interface AdmitBatchOptions extends RequestOptions {
  /**
   * Give each item without a `dispatch_key` one (`crypto.randomUUID()`, once
   * per call), so that the whole batch can be retried safely.
   */
  idempotent?: boolean;
  /** A W3C `traceparent` to pass on (the runs' admission joins that trace). */
  traceparent?: string;
}

/** The retried POST a batch is sent with: `PoimenClient.admitRuns` passes its own. */
export type BatchPost = (
  json: string,
  headers: Record<string, string>,
  retry: (error: PoimenProblem | PoimenNetworkError) => boolean,
) => Promise<{ value: { answer: ApiAnswer; json: unknown } }>;

/**
 * Sends `items` as one batch with `post` and resolves with each item's
 * result, in order (the items as sent, `dispatch_key`s generated with
 * `idempotent` included, are what the results answer). An empty batch
 * resolves with none and sends nothing; more than `RUN_BATCH_MAX_ITEMS`
 * items is a `RangeError` (split them: each batch is admitted on its own).
 */
export async function sendBatch(
  items: RunRequest[],
  opts: AdmitBatchOptions,
  post: BatchPost,
): Promise<RunBatchResult[]> {
  if (items.length === 0) return [];
  if (items.length > RUN_BATCH_MAX_ITEMS) {
    throw new RangeError(`a batch holds at most ${RUN_BATCH_MAX_ITEMS} runs, not ${items.length}`);
  }
  const sent = opts.idempotent === true
    ? items.map((item) =>
      item.dispatch_key == null ? { ...item, dispatch_key: crypto.randomUUID() } : item
    )
    : items;
  const keyed = sent.every((item) => item.dispatch_key != null);
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (opts.traceparent !== undefined) headers.traceparent = opts.traceparent;
  const { value: { json } } = await post(
    JSON.stringify(sent),
    headers,
    // Without a key for every item, a retry could admit a keyless one twice.
    keyed ? transient : (e) => e instanceof PoimenProblem && refusedForNow(e.status),
  );
  return (json as RunBatchAnswer).results;
}
