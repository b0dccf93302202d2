/**
 * Sending a signal to a run (`POST /v1/runs/{id}/signals`): what
 * `PoimenClient.signal` does, and `signalRun`, the same as a function. The
 * signal's id is generated once per call when not given, so a retry
 * (network errors, 408, 429, 5xx) is a replay of the same signal, never a
 * second one.
 *
 * ```ts
 * import { PoimenClient } from "@poimen/poimen/client";
 *
 * const poimen = new PoimenClient({ url, token });
 * await poimen.signal(runId, { name: "approval", payload: { ok: true } });
 * ```
 *
 * @module
 */
import { HEADERS, type SignalReceipt, type SignalRequest } from "../contracts/wire.ts";
import type { PoimenClient } from "./http.ts";
import type { ApiAnswer } from "./problems.ts";
import type { RequestOptions } from "./retry.ts";

/** What sending a signal came to. */
export interface SignalResult {
  /** The signal as the run's mailbox holds it (its `signal_id`: the one sent, or generated). */
  signal: SignalReceipt;
  /**
   * This call stored it: a 201, or, with a `signal_id` the call generated, a
   * 200 replay of its own earlier attempt (whose answer was lost).
   */
  created: boolean;
  /** The API had this (name, `signal_id`) already (200, `Idempotent-Replayed`). */
  replayed: boolean;
}

/**
 * Sends `body` with one `signal_id` for every attempt: `post` makes the
 * retried call with the JSON body it is given and resolves with its 2xx
 * answer (`PoimenClient.signal` passes its retrying request).
 */
export async function sendSignal(
  body: SignalRequest,
  post: (json: string) => Promise<{ value: { answer: ApiAnswer; json: unknown } }>,
): Promise<SignalResult> {
  const generated = body.signal_id === undefined || body.signal_id === null;
  // One id for every attempt: a retry is a replay, not a second signal.
  const request = { ...body, signal_id: generated ? crypto.randomUUID() : body.signal_id };
  const { value: { answer, json } } = await post(JSON.stringify(request));
  const replayed = answer.headers.get(HEADERS.replayed) === "true";
  return {
    signal: json as SignalReceipt,
    created: answer.status === 201 || (generated && answer.status === 200),
    replayed,
  };
}

/**
 * Sends signal `body.name` to run `runId` of the client's tenant: the same
 * as `client.signal(runId, body, opts)`, which see.
 */
export function signalRun(
  client: PoimenClient,
  runId: string,
  body: SignalRequest,
  opts: RequestOptions = {},
): Promise<SignalResult> {
  return client.signal(runId, body, opts);
}
