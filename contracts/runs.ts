/**
 * The wire contracts of runs, as zod schemas: the `POST /v1/runs` body (which
 * is also the value of a `poimen.<tenant>.dispatch` message), the run the API
 * returns, and problem+json. The API validates with them, the OpenAPI
 * document is generated from them, and publishers may import this module:
 * it depends on zod alone.
 */
import { z } from "zod";

// Printable: no control characters (C0, DEL, C1) and no lone surrogates.
const PRINTABLE = /^[^\p{Cc}\p{Cs}]+$/u;

// A workflow name, and a version that fits Postgres' int4 (9 digits).
const WORKFLOW_NAME = "[a-z][a-z0-9_.-]{0,99}";
const WORKFLOW_VERSION = "[1-9][0-9]{0,8}";

/** A workflow name as registered. */
export const WORKFLOW_NAME_PATTERN: RegExp = new RegExp(`^${WORKFLOW_NAME}$`);

/**
 * `name` or `name@version`, capturing both: the one pattern the API
 * validates with and the registry resolves with, so a ref the API accepts
 * is one the registry can look up.
 */
export const WORKFLOW_REF_PATTERN: RegExp = new RegExp(
  `^(${WORKFLOW_NAME})(?:@(${WORKFLOW_VERSION}))?$`,
);

/** The admission request: `POST /v1/runs` body and dispatch message value. */
export const RunRequest = z.strictObject({
  // 110: the longest ref the pattern allows (100-character name, @, 9 digits).
  workflow_ref: z.string().min(1).max(110).regex(
    WORKFLOW_REF_PATTERN,
    "expected name or name@version (a version of at most 9 digits)",
  ).describe("`name` (newest version, pinned at admission) or `name@version`"),
  input: z.unknown().optional().describe("The workflow's input (any JSON); null when absent"),
  goal_id: z.string().min(1).max(255).regex(PRINTABLE, "printable characters only").nullable()
    .optional().describe("Groups runs that serve one goal"),
  dispatch_key: z.string().min(1).max(255).regex(PRINTABLE, "printable characters only")
    .nullable().optional().describe(
      "Caller-chosen identity of the intended run: the same (tenant, dispatch_key) makes one run",
    ),
});
export type RunRequest = z.infer<typeof RunRequest>;

export const RunStatus = z.enum(["queued", "running", "succeeded", "failed", "cancelled"]);

/** A run as the API returns it. */
export const Run = z.object({
  run_id: z.uuid(),
  tenant_id: z.string(),
  workflow_ref: z.string().describe("As asked"),
  workflow: z.string().describe("The resolved workflow name"),
  workflow_version: z.number().int().describe("The version pinned at admission"),
  status: RunStatus,
  goal_id: z.string().nullable(),
  dispatch_key: z.string().nullable(),
  source: z.string().describe("`http:<token name>` or `kafka:<topic>/<partition>/<offset>`"),
  attempts: z.number().int(),
  max_attempts: z.number().int(),
  input: z.unknown().optional().describe("Only on GET /v1/runs/{run_id}"),
  result: z.unknown().nullable(),
  error: z.unknown().nullable(),
  created_at: z.string(),
  updated_at: z.string(),
  started_at: z.string().nullable(),
  finished_at: z.string().nullable(),
});
export type Run = z.infer<typeof Run>;

export const RunPage = z.object({
  runs: z.array(Run),
  next_cursor: z.string().nullable().describe(
    "Pass as `cursor` for the next page; null at the end",
  ),
});

export const ListRunsQuery = z.strictObject({
  goal_id: z.string().min(1).max(255).optional(),
  dispatch_key: z.string().min(1).max(255).optional(),
  status: RunStatus.optional(),
  limit: z.coerce.number().int().min(1).max(500).default(50),
  cursor: z.string().max(200).optional(),
});

/** RFC 9457 problem details. */
export const Problem = z.object({
  type: z.string(),
  title: z.string(),
  status: z.number().int(),
  detail: z.string().optional(),
  retryable: z.boolean(),
  errors: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
});
export type Problem = z.infer<typeof Problem>;

/** Headers of the admission protocol. */
export const HEADERS = {
  /** A service token names the tenant it acts for. */
  tenant: "Poimen-Tenant",
  /** A service token says where the request came from (the relay: `kafka:<topic>/<partition>/<offset>`). */
  source: "Poimen-Source",
  /** On 200: this dispatch key was seen, the body is the first run. */
  replayed: "Idempotent-Replayed",
  /** On a replay whose body differs from the original's. */
  bodyMismatch: "Idempotent-Body-Mismatch",
} as const;
