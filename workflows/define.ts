/**
 * Defining a workflow: `@poimen/poimen/workflow`.
 *
 * ```ts
 * import { z } from "zod";
 * import { defineWorkflow } from "@poimen/poimen/workflow";
 *
 * export const invoice = defineWorkflow({
 *   name: "billing.invoice",
 *   version: 1,
 *   input: z.object({ customer_id: z.string(), amount_cents: z.number().int().min(1) }),
 *   maxAttempts: 5,
 *   async handler(input, ctx) {
 *     ctx.log.info("invoicing", { customer_id: input.customer_id });
 *     return { invoiced: input.amount_cents };
 *   },
 * });
 * ```
 *
 * A worker hosting a definition registers it in the workflow catalog; the
 * API then validates each run's input against the definition's input as
 * JSON Schema, without loading this code. `name@version` is immutable once
 * registered: change the input, `maxAttempts`, `concurrency` or `tenants`
 * under a new version.
 *
 * @module
 */
import { z } from "zod";
import type { Logger } from "../core/log.ts";
import { WORKFLOW_NAME_PATTERN } from "../contracts/runs.ts";
import { type ConcurrencyLimit, concurrencyProblem } from "../contracts/concurrency.ts";
import { parseTenantScope } from "../contracts/tenant_scope.ts";

export type { ConcurrencyLimit } from "../contracts/concurrency.ts";
import type { DurableContext } from "./durable.ts";
export type { DurableContext, Signal, StepOptions, WaitForSignalOptions } from "./durable.ts";

export type { Fields, Logger } from "../core/log.ts";
/**
 * What `input` takes: a zod 4 schema (`z.object({...})` and the like), seen
 * by what a worker uses of it.
 */
export interface InputSchema<I> {
  /** zod's `safeParse`: the parsed value, or the issues. */
  safeParse(value: unknown):
    | { success: true; data: I }
    | { success: false; error: { issues: readonly { path: PropertyKey[]; message: string }[] } };
}

/**
 * What a handler gets besides its input: who it runs for, and the durable
 * calls (`step`, `stepKey`, `sleep`, `sleepUntil`, `waitForSignal`:
 * workflows/durable.ts).
 */
export interface WorkflowContext extends DurableContext {
  /** The tenant the run belongs to. */
  tenantId: string;
  /** The run's id (a UUIDv7). */
  runId: string;
  /** 1 on the first attempt (a run resumed after a wait keeps its number). */
  attempt: number;
  /**
   * Aborted when the worker shuts down, loses the run's lease, or the run is
   * cancelled. A handler that honours it throws (the attempt then ends
   * `cancelled` or released); one that returns a result anyway succeeds.
   */
  signal: AbortSignal;
  /** A structured logger that already carries `tenant`, `run_id` and `attempt`. */
  log: Logger;
}

/** One version of one workflow: what `defineWorkflow` takes. */
export interface WorkflowOptions<I = unknown> {
  /** `[a-z][a-z0-9_.-]{0,99}`, e.g. `billing.invoice`. */
  name: string;
  /** An integer from 1; a run names `name` (the newest version) or `name@version`. */
  version: number;
  /**
   * The input's zod 4 schema. The API validates against it as JSON Schema
   * (`z.toJSONSchema`, the input side). What JSON Schema cannot say — a
   * `.refine()`, a `.transform()`'s logic, `z.date()`, a custom type — is
   * not checked at admission: those parts admit any value there. The worker
   * still parses the input with this full schema before the handler runs; a
   * failure there ends the run `failed` with code `invalid-input`, at once.
   * The handler gets the parsed value.
   */
  input: InputSchema<I>;
  /** Attempts before the run is `failed` (1–1000); unset: the API's DEFAULT_MAX_ATTEMPTS. */
  maxAttempts?: number;
  /**
   * At most `limit` runs of this workflow running at once per tenant, or per
   * value of `key`, a JSON Pointer into the input (`"/customer_id"`)
   * evaluated at admission: a run whose input has no string, number or
   * boolean there is refused (422). A run over its limit stays queued and
   * starts when a slot of its key frees, highest priority first, then
   * oldest; the keys with room take turns. Registered in the catalog with
   * the version: every worker and the API know it without this code. The
   * limit is per workflow name: versions that declare different limits
   * share the newest admitted run's.
   */
  concurrency?: ConcurrencyLimit;
  /**
   * The tenants that may start this version: tenant ids and prefixes
   * (`["acme", "team-*"]`, contracts/tenant_scope.ts); unset (or `["*"]`):
   * every tenant. Registered in the catalog with the version; the API
   * answers any other tenant's run of it as an unknown workflow (422) and
   * never names it to them. A run naming the workflow without a version
   * gets the newest version its tenant may start.
   */
  tenants?: readonly string[];
  /** Returns the run's result (JSON), or throws to fail the attempt (retried while attempts remain). */
  handler(input: I, ctx: WorkflowContext): Promise<unknown>;
}

const DEFINED: unique symbol = Symbol.for("poimen.workflow");

/** A workflow version made by `defineWorkflow`: give it to a worker. */
export interface Workflow<I = unknown> extends Readonly<WorkflowOptions<I>> {
  /** The input as JSON Schema (draft 2020-12), as the catalog stores it. */
  readonly inputSchema: Readonly<Record<string, unknown>>;
}

/**
 * Defines one version of a workflow. Throws a `TypeError` naming the
 * workflow when the name, version or max attempts is invalid, so a bad
 * definition fails where it is imported.
 */
export function defineWorkflow<I>(options: WorkflowOptions<I>): Workflow<I> {
  const label = `${String(options.name)}@${String(options.version)}`;
  if (typeof options.name !== "string" || !WORKFLOW_NAME_PATTERN.test(options.name)) {
    throw new TypeError(`workflow ${label}: name must match ${WORKFLOW_NAME_PATTERN.source}`);
  }
  if (!Number.isInteger(options.version) || options.version < 1 || options.version > 999_999_999) {
    throw new TypeError(`workflow ${label}: version must be an integer from 1 to 999999999`);
  }
  const max = options.maxAttempts;
  if (max !== undefined && (!Number.isInteger(max) || max < 1 || max > 1000)) {
    throw new TypeError(`workflow ${label}: maxAttempts must be an integer from 1 to 1000`);
  }
  if (options.concurrency !== undefined) {
    const problem = concurrencyProblem(options.concurrency);
    if (problem) throw new TypeError(`workflow ${label}: ${problem}`);
  }
  let tenants: readonly string[] | undefined;
  if (options.tenants !== undefined) {
    if (!Array.isArray(options.tenants)) {
      throw new TypeError(`workflow ${label}: tenants must be a list (["acme", "team-*"])`);
    }
    const parsed = parseTenantScope(options.tenants);
    if (parsed.problem !== undefined) {
      throw new TypeError(`workflow ${label}: tenants: ${parsed.problem}`);
    }
    tenants = parsed.scope.all ? undefined : Object.freeze(parsed.scope.text.split(","));
  }
  if (typeof options.handler !== "function") {
    throw new TypeError(`workflow ${label}: handler must be a function`);
  }
  if (!isZodLike(options.input)) {
    throw new TypeError(`workflow ${label}: input must be a zod schema`);
  }
  return Object.freeze({
    name: options.name,
    version: options.version,
    input: options.input,
    maxAttempts: max,
    concurrency: options.concurrency === undefined ? undefined : Object.freeze({
      limit: options.concurrency.limit,
      ...(options.concurrency.key === undefined ? {} : { key: options.concurrency.key }),
    }),
    tenants,
    handler: options.handler,
    inputSchema: Object.freeze(inputJsonSchema(options.input)),
    // Marks what defineWorkflow made (isWorkflow), across copies of this module.
    [DEFINED]: true,
  }) as Workflow<I>;
}

/** Whether `value` was made by `defineWorkflow` (in any copy of this module). */
export function isWorkflow(value: unknown): value is Workflow {
  return typeof value === "object" && value !== null &&
    (value as Record<symbol, unknown>)[DEFINED] === true;
}

/**
 * The input side of a zod schema as JSON Schema. Unrepresentable parts
 * (dates, custom types) become `{}`, which admits anything: the worker's
 * parse with the full schema is the last word.
 */
function inputJsonSchema(schema: unknown): Record<string, unknown> {
  return z.toJSONSchema(schema as z.ZodType, { io: "input", unrepresentable: "any" }) as Record<
    string,
    unknown
  >;
}

// Any zod 4 schema, also from another copy of zod 4 (a project pinning
// another release): toJSONSchema and safeParse work on its `_zod` internals.
function isZodLike(value: unknown): boolean {
  return typeof value === "object" && value !== null && "_zod" in value &&
    typeof (value as { safeParse?: unknown }).safeParse === "function";
}
