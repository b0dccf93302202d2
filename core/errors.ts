/**
 * The one error module. Every failure poimen reports on purpose is a
 * `PoimenError` with a stable `code` (also the problem+json `type` suffix),
 * an HTTP status and a `retryable` flag; HTTP mapping happens once, in the
 * API's `onError`, and the relay reads the same flags from problem bodies.
 */

export type ErrorCode =
  | "bad-json"
  | "validation"
  | "unknown-workflow"
  | "body-too-large"
  | "unsupported-media-type"
  | "unauthorized"
  | "forbidden"
  | "not-found"
  | "database-unavailable"
  | "config"
  | "internal";

const STATUS: Record<ErrorCode, number> = {
  "bad-json": 400,
  validation: 422,
  "unknown-workflow": 422,
  "body-too-large": 413,
  "unsupported-media-type": 415,
  unauthorized: 401,
  forbidden: 403,
  "not-found": 404,
  "database-unavailable": 503,
  config: 500,
  internal: 500,
};

const RETRYABLE: ReadonlySet<ErrorCode> = new Set([
  "database-unavailable",
  "internal",
]);

/** One failing field of a schema error, as reported in problem+json. */
export interface FieldError {
  path: string;
  message: string;
}

export class PoimenError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly retryable: boolean;
  readonly errors?: FieldError[];

  constructor(
    code: ErrorCode,
    message: string,
    options: { cause?: unknown; errors?: FieldError[] } = {},
  ) {
    super(message, { cause: options.cause });
    this.name = "PoimenError";
    this.code = code;
    this.status = STATUS[code];
    this.retryable = RETRYABLE.has(code);
    this.errors = options.errors;
  }
}

/** Base of every problem `type` URI; the code is appended. */
export const PROBLEM_BASE = "https://poimen.dev/problems/";

/** A configuration error: `main.ts` prints its message as one line and exits 2. */
export class ConfigError extends PoimenError {
  constructor(message: string) {
    super("config", message);
    this.name = "ConfigError";
  }
}
