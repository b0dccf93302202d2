/**
 * The one error module. Every failure poimen reports on purpose is a
 * `PoimenError` with a stable `code` (also the problem+json `type` suffix),
 * an HTTP status and a `retryable` flag; HTTP mapping happens once, in the
 * API's `onError`, and the relay reads the same flags from problem bodies.
 */

/** What one error code means: its HTTP status, problem+json title and whether a retry may succeed. */
export interface ErrorKind {
  status: number;
  title: string;
  retryable: boolean;
}

/**
 * Every code poimen reports, in one table. The API's problem bodies, the
 * relay's retry decisions (it reads `retryable` from those bodies) and the
 * worker's run errors (`runs.error.code`) all use these codes. Codes that
 * never reach HTTP (`config`, `workflow-conflict`, `invalid-input`,
 * `invalid-output`, `bad-result`, `result-too-large`, `non-determinism`, `step-too-large`,
 * `lease-expired`, `kafka-unavailable`, `kafka-refused`) still get a status,
 * so that one type covers all.
 */
export const ERRORS = {
  "bad-json": { status: 400, title: "Request body is not valid JSON", retryable: false },
  validation: { status: 422, title: "Request does not match the schema", retryable: false },
  "unknown-workflow": { status: 422, title: "Unknown workflow", retryable: false },
  /**
   * Postgres refused a value of the request (a data exception, SQLSTATE
   * class 22, or an integrity violation, class 23, other than a dispatch
   * key's dedup, which is no error): the door should have refused it as
   * `validation`, and missed. The same request fails every time, so it is a
   * final 4xx (the relay dead-letters it), never a retryable 500.
   */
  "invalid-data": {
    status: 422,
    title: "The database cannot store a value of the request",
    retryable: false,
  },
  "body-too-large": { status: 413, title: "Request body too large", retryable: false },
  "unsupported-media-type": {
    status: 415,
    title: "Content type must be application/json",
    retryable: false,
  },
  unauthorized: { status: 401, title: "Authentication required", retryable: false },
  forbidden: { status: 403, title: "Not allowed for this tenant", retryable: false },
  "not-found": { status: 404, title: "Not found", retryable: false },
  /**
   * The body stream failed before its end (the client went away or sent a
   * broken chunked body): the client's doing, and worth sending again.
   */
  "body-unreadable": { status: 400, title: "Request body could not be read", retryable: true },
  /**
   * The body did not arrive within BODY_READ_TIMEOUT_MS: a slow sender must
   * not hold its share of BODY_BUDGET_BYTES for as long as it likes.
   */
  "body-timeout": { status: 408, title: "Request body too slow", retryable: true },
  /** Cancelling a run that already succeeded or failed: it is left as it is. */
  "run-finished": { status: 409, title: "Run already finished", retryable: false },
  /** Creating a schedule whose id the tenant already has (`/v1/schedules`): PATCH it instead. */
  "schedule-exists": { status: 409, title: "Schedule already exists", retryable: false },
  /**
   * Changing (other than pausing) or deleting a schedule a workflow's
   * definition declares: a new version of the definition changes it.
   */
  "schedule-declared": {
    status: 409,
    title: "Schedule declared by a workflow definition",
    retryable: false,
  },
  "database-unavailable": { status: 503, title: "Database unavailable", retryable: true },
  /** More request bodies in progress than BODY_BUDGET_BYTES allows, for longer than BODY_BUDGET_WAIT_MS. */
  busy: { status: 503, title: "Server busy", retryable: true },
  /**
   * The tenant has its max_queued queued runs (`deno task tenant`): nothing
   * is admitted until workers take some (admission/quota.ts). Retryable:
   * the relay retries such a message with backoff, never dead-letters it.
   */
  "queue-full": { status: 429, title: "The tenant's queue is full", retryable: true },
  /** The tenant admits faster than its admission_rate (`deno task tenant`). Retryable. */
  "rate-limited": {
    status: 429,
    title: "The tenant's admission rate is exceeded",
    retryable: true,
  },
  /**
   * The tenant holds its share of this API process's waits and event streams
   * (RUN_WATCHERS_PER_TENANT): a new stream is refused, with Retry-After,
   * whatever other tenants hold. A wait past it is answered without waiting.
   */
  "too-many-streams": {
    status: 429,
    title: "The tenant holds its share of waits and event streams",
    retryable: true,
  },
  config: { status: 500, title: "Invalid configuration", retryable: false },
  /**
   * A worker's definition of a `name@version` differs from the one in the
   * workflow catalog (versions are immutable): it refuses to start, exit 2.
   * Never HTTP.
   */
  "workflow-conflict": {
    status: 500,
    title: "Workflow version already registered with another definition",
    retryable: false,
  },
  /**
   * A run's stored input failed the workflow's full zod schema in the worker
   * (a refinement or transform the catalog's JSON Schema cannot express): a
   * run error, never HTTP. Final: the same input fails every attempt.
   */
  "invalid-input": { status: 500, title: "Input rejected by the workflow", retryable: false },
  /**
   * A handler's result failed its workflow's `output` schema in the worker
   * (a run error, never HTTP; `error.issues` names the fields). Not
   * retryable: the run fails at once. The handler broke the shape its
   * definition promises callers, which the same code and input would break
   * again; the fix is a deploy, and the run's attempts would be spent
   * waiting for it.
   */
  "invalid-output": {
    status: 500,
    title: "Result rejected by the workflow's output schema",
    retryable: false,
  },
  /** A workflow handler returned a result that is not JSON (a run error, never HTTP). */
  "bad-result": { status: 500, title: "Workflow result is not JSON", retryable: false },
  /**
   * A workflow handler returned a result over RUN_RESULT_MAX_BYTES (a run
   * error, never HTTP). Not retryable: the same input gives the same result.
   */
  "result-too-large": {
    status: 500,
    title: "Workflow result is larger than RUN_RESULT_MAX_BYTES",
    retryable: false,
  },
  /**
   * A replay of a durable run met a call that differs from the one stored in
   * its place (another kind, another name, another order): the handler's
   * code changed under a deployed version, or is not deterministic (a run
   * error, never HTTP). Final: a retry replays the same way.
   */
  "non-determinism": {
    status: 500,
    title: "The handler's durable calls differ from those stored",
    retryable: false,
  },
  /**
   * A durable step's result is over RUN_STEP_MAX_BYTES (a run error, never
   * HTTP). Final: the same step gives the same result again.
   */
  "step-too-large": {
    status: 500,
    title: "A step's result is larger than RUN_STEP_MAX_BYTES",
    retryable: false,
  },
  /**
   * A run's last attempt ended with its lease expired (the worker died or
   * lost Postgres): written by the reclaimer's SQL (db/leases.ts) as a run
   * error, never HTTP. Final: the attempts are spent.
   */
  "lease-expired": { status: 500, title: "The run's lease expired", retryable: false },
  /**
   * The Kafka broker did not take or give what was asked within its bound
   * (never HTTP: the outbox and the relay retry with backoff, a CLI exits 1).
   */
  "kafka-unavailable": { status: 503, title: "Kafka unavailable", retryable: true },
  /**
   * The broker refused records as they are (too large, invalid): sending them
   * again cannot help; the outbox parks them.
   */
  "kafka-refused": { status: 500, title: "Kafka refused the records", retryable: false },
  internal: { status: 500, title: "Internal error", retryable: true },
} as const satisfies Record<string, ErrorKind>;

/** A stable error code: the problem `type` suffix and `runs.error.code`. */
export type ErrorCode = keyof typeof ERRORS;

/** One failing field of a schema error, as reported in problem+json. */
export interface FieldError {
  path: string;
  message: string;
}

/** An error poimen reports on purpose: its code, and that code's status and flag from `ERRORS`. */
export class PoimenError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly retryable: boolean;
  readonly errors?: FieldError[];
  /** Extension members of the problem body (RFC 9457 §3.2), e.g. `run_status`. */
  readonly extensions?: Record<string, string>;
  /** The answer's `Retry-After`, in whole seconds, when this error knows it (a 429). */
  readonly retryAfterSeconds?: number;

  constructor(
    code: ErrorCode,
    message: string,
    options: {
      cause?: unknown;
      errors?: FieldError[];
      extensions?: Record<string, string>;
      retryAfterSeconds?: number;
    } = {},
  ) {
    super(message, { cause: options.cause });
    this.name = "PoimenError";
    this.code = code;
    this.status = ERRORS[code].status;
    this.retryable = ERRORS[code].retryable;
    this.errors = options.errors;
    this.extensions = options.extensions;
    this.retryAfterSeconds = options.retryAfterSeconds;
  }
}

/**
 * What `error` wraps: its `cause`, or for an AggregateError its last error
 * (the Kafka library reports the attempt that failed last that way). One
 * definition of an error's chain, for the logger and for Kafka's messages.
 */
export function nextCause(error: Error): unknown {
  const nested = (error as { errors?: unknown }).errors;
  return Array.isArray(nested) && nested.length > 0 ? nested[nested.length - 1] : error.cause;
}

/** Base of every problem `type` URI; the code is appended. */
export const PROBLEM_BASE = "https://poimen.dev/problems/";

/**
 * A refusal to start that a restart cannot fix (a bad variable, a workflow
 * version registered with another definition): a process exits 2 with its
 * message as one line.
 */
export function isRefusal(err: unknown): err is PoimenError {
  return err instanceof PoimenError && (err.code === "config" || err.code === "workflow-conflict");
}

/**
 * A configuration error (`readEnv`'s, one line naming the variable): a
 * refusal to start; `main.ts` prints its message and exits 2.
 */
export class ConfigError extends PoimenError {
  constructor(message: string) {
    super("config", message);
    this.name = "ConfigError";
  }
}
