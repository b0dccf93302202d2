/**
 * Sending a signal to a run (`POST /v1/runs/{id}/signals`) with a
 * `PoimenClient`: a function beside the client's methods, over its public
 * `send`. The signal's id is generated once per call when not given, so a
 * retry (network errors, 408, 429, 5xx) is a replay of the same signal,
 * never a second one.
 *
 * ```ts
 * import { PoimenClient, signalRun } from "@poimen/poimen/client";
 *
 * const poimen = new PoimenClient({ url, token });
 * await signalRun(poimen, runId, { name: "approval", payload: { ok: true } });
 * ```
 */
import { HEADERS, type SignalReceipt, type SignalRequest } from "../contracts/wire.ts";
import type { PoimenClient } from "./http.ts";
import { problemFromAnswer, unexpectedAnswer } from "./problems.ts";
import { type RequestOptions, retrying, transient } from "./retry.ts";

/** What `signalRun` came to. */
export interface SignalResult {
  /** The signal as the run's mailbox holds it. */
  signal: SignalReceipt;
  /** The API stored it now (201); false: it had it already (200, `Idempotent-Replayed`). */
  created: boolean;
}

// The client's default per-attempt timeout.
const TIMEOUT_MS = 30_000;

/**
 * Sends signal `body.name` to run `runId` of the client's tenant. Resolves
 * when the run's mailbox holds it (a wait of the run's handler takes it, and
 * a run waiting for it is woken); rejects with a `PoimenProblem`: 404
 * `not-found` (no such run), 409 `run-finished` (the run is final: a new
 * signal is refused), 422 `validation`; or a `PoimenNetworkError` once
 * retries are spent, or the signal's reason.
 */
export async function signalRun(
  client: PoimenClient,
  runId: string,
  body: SignalRequest,
  opts: RequestOptions = {},
): Promise<SignalResult> {
  // One id for every attempt: a retry is a replay, not a second signal.
  const request = { ...body, signal_id: body.signal_id ?? crypto.randomUUID() };
  const path = `/v1/runs/${encodeURIComponent(runId)}/signals`;
  const { value } = await retrying(opts, {}, TIMEOUT_MS, transient, async (signal) => {
    const answer = await client.send("POST", path, {
      headers: { "content-type": "application/json" },
      body: JSON.stringify(request),
      signal,
    });
    if (answer.status !== 200 && answer.status !== 201) throw problemFromAnswer(answer);
    try {
      return {
        signal: JSON.parse(answer.text) as SignalReceipt,
        created: answer.status === 201 && answer.headers.get(HEADERS.replayed) !== "true",
      };
    } catch (err) {
      throw unexpectedAnswer(answer, "the answer is not JSON", err);
    }
  });
  return value;
}
