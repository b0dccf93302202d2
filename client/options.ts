/**
 * The shapes `PoimenClient`'s calls take and give: its options, `admitRun`'s
 * options and answer, and `listRuns`' filter.
 *
 * @module
 */
import type { Run, RunStatus } from "../contracts/wire.ts";
import type { RequestOptions, RetryOptions } from "./retry.ts";

// The options of every call, re-exported by client/http.ts in one line.
export type { FollowRunOptions, ReconnectInfo } from "./follow_run.ts";
export type { RequestOptions, RetryInfo, RetryOptions } from "./retry.ts";
export type { WaitForRunOptions } from "./wait_for_run.ts";

/** Options of `admitRun`. */
export interface AdmitOptions extends RequestOptions {
  /**
   * When the body has no `dispatch_key`, generate one (`crypto.randomUUID()`,
   * once per call) so that the call can be retried safely. Without a key and
   * without this, a retry could make a second run, so only answers that say
   * nothing was admitted (408, 429, 503) are retried.
   */
  idempotent?: boolean;
  /** A W3C `traceparent` to pass on (the run's admission joins that trace). */
  traceparent?: string;
  /**
   * Wait up to this long, in ms, for the run to be final before answering
   * (`Prefer: wait=N`: rounded up to whole seconds, at most 60 s). The run
   * comes back as it then is: check its `status`, and call `waitForRun`
   * to wait longer. Each attempt may take this much longer than `timeoutMs`.
   * Without it, the API answers at once.
   */
  waitMs?: number;
}

/** What `admitRun` came to. */
export interface AdmitResult {
  /** The run: the new one, or the one the `dispatch_key` already named. */
  run: Run;
  /**
   * This call made the run: the API answered 201, or 200 for a key this
   * client generated (nobody else knows it, so the run was made by an earlier
   * attempt of this call whose answer was lost).
   */
  created: boolean;
  /** The API answered with an existing run (200, `Idempotent-Replayed: true`). */
  replayed: boolean;
  /**
   * The request joined the pending run of its debounce key (200,
   * `debounced: true`: docs/workflows.md#debounce): the run's input is now
   * this request's; `created` and `replayed` are false.
   */
  debounced: boolean;
  /**
   * The existing run was asked for with a different body
   * (`Idempotent-Body-Mismatch: true`): the same key was reused for another
   * request, most likely a caller bug.
   */
  bodyMismatch: boolean;
  /** The `dispatch_key` sent (the caller's or the generated one); null when none. */
  dispatchKey: string | null;
  /** How many attempts the call took. */
  attempts: number;
}

/** Which runs `listRuns` returns; all optional. */
export interface ListRunsFilter {
  /** Only the runs of this goal. */
  goal_id?: string;
  /** Only the run asked for with this key. */
  dispatch_key?: string;
  /** Only runs in this status. */
  status?: RunStatus;
  /** Runs per page, 1–500 (default 50). */
  limit?: number;
  /** Start after this cursor (a `next_cursor` of an earlier page). */
  cursor?: string;
  /**
   * A run's large values to include (`fields=`): a list leaves `input` and
   * `result` out unless asked for.
   */
  fields?: readonly ("input" | "result")[];
}

/** Options of `new PoimenClient`. */
export interface PoimenClientOptions {
  /** Base URL of the API, e.g. `http://127.0.0.1:8080` (a path prefix is kept). */
  url: string;
  /** A tenant token, or a service token together with `tenant`. */
  token: string;
  /** The tenant a service token acts for (sent as `Poimen-Tenant`). */
  tenant?: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** Longest one attempt may take, in ms (default 30 s). */
  timeoutMs?: number;
  /** Default retry options of every call. */
  retry?: RetryOptions;
}
