/**
 * `PoimenClient.followRun`: a run's events as they commit, over the API's
 * `text/event-stream`, carried across dropped connections by `Last-Event-ID`
 * so that each event is yielded once, in order, with none missing.
 *
 * @module
 */
import { FINAL_STATUSES, RECONNECT_COMMENT, type Run, type RunEvent } from "../contracts/wire.ts";
import { FINAL_EVENT_TYPES } from "../contracts/event_types.ts";
import { backoffWithJitter, SECOND } from "../core/time.ts";
import { EventStreamParser } from "./event_stream.ts";
import {
  type ApiAnswer,
  PoimenNetworkError,
  PoimenProblem,
  problemFromAnswer,
  unexpectedAnswer,
} from "./problems.ts";
import { type RequestOptions, sleep } from "./retry.ts";

/** What `onReconnect` is told before `followRun` connects again. */
export interface ReconnectInfo {
  /** The last seq yielded (sent as `Last-Event-ID`); 0 when none. */
  after: number;
  /** How long the client waits before connecting. */
  delayMs: number;
  /** Why the last connection ended: a `PoimenNetworkError`, or undefined when the API closed it. */
  error: unknown;
}

/** Options of `followRun`. */
export interface FollowRunOptions extends Omit<RequestOptions, "deadlineMs" | "timeoutMs"> {
  /**
   * Longest the opening of one connection may take until the answer's
   * headers, in ms (default: the client's `timeoutMs`); the stream itself
   * stays open as long as the run runs.
   */
  connectTimeoutMs?: number;
  /**
   * Yield only the events after this seq, as if a connection had ended
   * after it (default 0: from the first): a follower that stopped resumes
   * where it was.
   */
  after?: number;
  /**
   * A connection that brings nothing (no event, no keep-alive comment) for
   * this long, in ms, is taken for dead and replaced (default 45 s: the API
   * sends a comment every 15 s, `RUN_STREAM_HEARTBEAT_MS`).
   */
  idleTimeoutMs?: number;
  /** Called before each reconnection, e.g. to log it. */
  onReconnect?: (info: ReconnectInfo) => void;
}

/** What the follow loop needs of the client. */
export interface FollowDeps {
  /**
   * Opens the stream after seq `after`, retried by the client's rules;
   * resolves with its body, rejects once retries are spent.
   */
  open(after: number, signal: AbortSignal): Promise<ReadableStream<Uint8Array>>;
  /** The run now, retried by the client's rules. */
  getRun(signal: AbortSignal): Promise<Run>;
  /** Backoff of reconnections. */
  baseDelayMs: number;
  maxDelayMs: number;
}

const DEFAULT_IDLE_MS = 45 * SECOND;

/**
 * The follow loop as an iterator whose `return()` (a `break` out of the
 * loop) aborts the connection at once, also while a `next()` is pending.
 */
export function followEvents(
  deps: FollowDeps,
  opts: FollowRunOptions,
): AsyncIterableIterator<RunEvent> {
  const closed = new AbortController();
  const signal = opts.signal ? AbortSignal.any([opts.signal, closed.signal]) : closed.signal;
  const inner = follow(deps, opts, signal, closed.signal);
  const iterator: AsyncIterableIterator<RunEvent> = {
    next: () => inner.next(),
    return: (value?: unknown) => {
      closed.abort();
      return inner.return(value as undefined);
    },
    [Symbol.asyncIterator]: () => iterator,
  };
  return iterator;
}

async function* follow(
  deps: FollowDeps,
  opts: FollowRunOptions,
  signal: AbortSignal,
  closed: AbortSignal,
): AsyncGenerator<RunEvent, void, undefined> {
  const idleMs = opts.idleTimeoutMs ?? DEFAULT_IDLE_MS;
  let after = opts.after ?? 0;
  let finalSeen = false;
  // The run was final before the current connection opened: the API sends
  // all of a final run's events, so that connection's clean end is the end.
  let lastConnection = false;
  let fruitless = 0;
  try {
    for (;;) {
      signal.throwIfAborted();
      const connection = new AbortController();
      const abort = () => connection.abort(signal.reason);
      signal.addEventListener("abort", abort, { once: true });
      let dropped: unknown;
      let yielded = 0;
      // The API said the stream reached its lifetime: reconnect at once.
      let lifetimeEnd = false;
      let idle: ReturnType<typeof setTimeout> | undefined;
      try {
        const body = await deps.open(after, connection.signal);
        const reader = body.getReader();
        const arm = () => {
          clearTimeout(idle);
          idle = setTimeout(() => connection.abort(), idleMs);
        };
        try {
          const decoder = new TextDecoder();
          const parser = new EventStreamParser();
          for (arm();;) {
            const { done, value } = await reader.read();
            if (done) break;
            arm();
            const events = parser.push(decoder.decode(value, { stream: true }));
            for (const comment of parser.takeComments()) {
              if (comment.startsWith(RECONNECT_COMMENT)) lifetimeEnd = true;
            }
            for (const sse of events) {
              const event = runEvent(sse.data);
              // A repeat (an API that resent it) is dropped: each event once.
              if (event.seq <= after) continue;
              after = event.seq;
              yielded++;
              if (FINAL_EVENT_TYPES.has(event.type)) finalSeen = true;
              yield event;
            }
          }
        } catch (err) {
          if (signal.aborted) throw signal.reason;
          if (err instanceof PoimenProblem) throw err;
          dropped = connection.signal.aborted
            ? new PoimenNetworkError("timeout", `nothing on the stream for ${idleMs} ms`)
            : new PoimenNetworkError("network", `event stream cut: ${message(err)}`, {
              cause: err,
            });
        } finally {
          clearTimeout(idle);
          reader.cancel().catch(() => {});
        }
      } finally {
        signal.removeEventListener("abort", abort);
        connection.abort();
      }
      // The final event came: whatever ended the stream after it, that is all.
      if (finalSeen) return;
      if (dropped === undefined && lifetimeEnd) {
        // Not the run's end: the API ends streams at their lifetime.
        fruitless = 0;
        opts.onReconnect?.({ after, delayMs: 0, error: undefined });
        continue;
      }
      if (dropped === undefined) {
        // The API ended the stream without the final event: it is stopping,
        // or the run is final and its last events were purged. Ask.
        if (lastConnection) return;
        if (FINAL_STATUSES.has((await deps.getRun(signal)).status)) {
          lastConnection = true;
          opts.onReconnect?.({ after, delayMs: 0, error: undefined });
          continue;
        }
      }
      fruitless = yielded > 0 ? 0 : fruitless + 1;
      // The client's backoff, not the stream's `retry:` (meant for
      // EventSource): full jitter spreads the followers of a restarted API.
      const delayMs = backoffWithJitter(fruitless, deps.baseDelayMs, deps.maxDelayMs);
      opts.onReconnect?.({ after, delayMs, error: dropped });
      await sleep(delayMs, signal);
    }
  } catch (err) {
    // Closed by return(): end quietly; the caller's abort rejects with its reason.
    if (closed.aborted && !opts.signal?.aborted) return;
    throw err;
  }
}

/**
 * One attempt at opening a run's event stream: its body once the API
 * answered with one, else the problem the answer is. `attempt` (its
 * timeout) bounds the wait for the answer's head; `stream` bounds the
 * stream after it.
 */
export async function openEventStream(
  fetch: typeof globalThis.fetch,
  url: string,
  headers: Record<string, string>,
  stream: AbortSignal,
  attempt: AbortSignal,
): Promise<ReadableStream<Uint8Array>> {
  const head = new AbortController();
  const abortHead = () => head.abort();
  attempt.addEventListener("abort", abortHead, { once: true });
  let answer: ApiAnswer;
  try {
    const response = await fetch(url, {
      headers,
      redirect: "manual",
      signal: AbortSignal.any([head.signal, stream]),
    });
    const type = response.headers.get("content-type") ?? "";
    if (response.ok && response.body && /^text\/event-stream\b/i.test(type)) return response.body;
    answer = { status: response.status, headers: response.headers, text: await response.text() };
  } catch (err) {
    if (stream.aborted) throw stream.reason;
    throw new PoimenNetworkError("network", `GET ${url}: ${message(err)}`, { cause: err });
  } finally {
    attempt.removeEventListener("abort", abortHead);
  }
  throw answer.status < 300
    ? unexpectedAnswer(answer, "not an event stream")
    : problemFromAnswer(answer);
}

function runEvent(data: string): RunEvent {
  let event: unknown;
  try {
    event = JSON.parse(data);
  } catch (err) {
    throw unexpected(`an event's data is not JSON: ${data.slice(0, 200)}`, err);
  }
  if (typeof event !== "object" || event === null || !Number.isInteger((event as RunEvent).seq)) {
    throw unexpected(`an event has no seq: ${data.slice(0, 200)}`);
  }
  return event as RunEvent;
}

function unexpected(detail: string, cause?: unknown): PoimenProblem {
  return new PoimenProblem({
    code: PoimenProblem.UNEXPECTED,
    type: "about:blank",
    status: 200,
    retryable: false,
    title: "not a run's event stream",
    detail,
    cause,
  });
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
