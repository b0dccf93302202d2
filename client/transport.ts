/**
 * One request to the API, as `PoimenClient` makes it: `sendRequest` sends
 * it and reads its answer whatever the status, `jsonAnswer` turns a 2xx
 * answer into its JSON and anything else into the error it is, and
 * `runsQuery` builds `GET /v1/runs`'s query. Kept apart from client/http.ts
 * so the client class holds its methods and nothing else.
 *
 * @module
 */
import {
  type ApiAnswer,
  PoimenNetworkError,
  problemFromAnswer,
  type SendInit,
  unexpectedAnswer,
} from "./problems.ts";
import type { ListRunsFilter } from "./options.ts";

/**
 * Sends one request to `url` with `headers` (the client's, `init.headers`
 * added) and reads the answer to the end, whatever its status; rejects
 * with a `PoimenNetworkError` when none came, or with the signal's reason.
 */
export async function sendRequest(
  fetcher: typeof fetch,
  url: string,
  headers: Record<string, string>,
  method: string,
  init: SendInit,
): Promise<ApiAnswer> {
  let response: Response;
  let text: string;
  try {
    response = await fetcher(url, {
      method,
      headers: init.headers ? { ...headers, ...init.headers } : headers,
      // A Kafka value or a caller's buffer never sits on a SharedArrayBuffer.
      body: init.body as string | Uint8Array<ArrayBuffer> | undefined,
      // A redirected POST would come back as a GET: report it instead.
      redirect: "manual",
      signal: init.signal,
    });
    // Read to the end, also on errors, so the connection can be reused.
    text = await response.text();
  } catch (err) {
    if (init.signal?.aborted) throw init.signal.reason;
    const message = err instanceof Error ? err.message : String(err);
    throw new PoimenNetworkError("network", `${method} ${url}: ${message}`, { cause: err });
  }
  return { status: response.status, headers: response.headers, text };
}

/**
 * The answer `send` brings, as one attempt of a retried call sees it:
 * resolves with a 2xx answer and its JSON; rejects with the problem any
 * other status is, a `PoimenNetworkError` when no answer came (an aborted
 * attempt included: the caller tells its timeout from its own abort), or
 * a `PoimenProblem` when a 2xx is not JSON.
 */
export async function jsonAnswer(
  what: string,
  signal: AbortSignal,
  send: () => Promise<ApiAnswer>,
): Promise<{ answer: ApiAnswer; json: unknown }> {
  let answer: ApiAnswer;
  try {
    answer = await send();
  } catch (err) {
    if (err instanceof PoimenNetworkError || !signal.aborted) throw err;
    throw new PoimenNetworkError("network", `${what}: aborted`, { cause: err });
  }
  if (answer.status >= 200 && answer.status < 300) {
    try {
      return { answer, json: JSON.parse(answer.text) };
    } catch (err) {
      throw unexpectedAnswer(answer, "the answer is not JSON", err);
    }
  }
  throw problemFromAnswer(answer);
}

/** `GET /v1/runs`'s query for `filter`, from `cursor` on. */
export function runsQuery(filter: ListRunsFilter, cursor: string | undefined): URLSearchParams {
  const query = new URLSearchParams();
  if (filter.goal_id !== undefined) query.set("goal_id", filter.goal_id);
  if (filter.dispatch_key !== undefined) query.set("dispatch_key", filter.dispatch_key);
  if (filter.status !== undefined) query.set("status", filter.status);
  if (filter.limit !== undefined) query.set("limit", String(filter.limit));
  if (cursor !== undefined) query.set("cursor", cursor);
  if (filter.fields?.length) query.set("fields", filter.fields.join(","));
  return query;
}
