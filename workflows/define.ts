/**
 * Defining a workflow: `@poimen/poimen/workflow`.
 *
 * A definition names one version of a workflow and its input and output
 * schemas, and nothing else: a service that only starts runs imports it
 * without the handler's dependencies (a payment SDK, a database client).
 * The worker's code implements it.
 *
 * ```ts
 * // definitions.ts: no handler, imported by producers and the worker
 * import { z } from "zod";
 * import { defineWorkflow } from "@poimen/poimen/workflow";
 *
 * export const invoice = defineWorkflow({
 *   name: "billing.invoice",
 *   version: 1,
 *   input: z.object({ customer_id: z.string(), amount_cents: z.number().int().min(1) }),
 *   output: z.object({ invoiced: z.number() }),
 *   maxAttempts: 5,
 * });
 * ```
 *
 * ```ts
 * // worker.ts: what a worker hosts
 * import { implement } from "@poimen/poimen/workflow";
 * import { invoice } from "./definitions.ts";
 *
 * export const invoiceImpl = implement(invoice, async (input, ctx) => {
 *   ctx.log.info("invoicing", { customer_id: input.customer_id });
 *   return { invoiced: input.amount_cents };
 * });
 * ```
 *
 * `defineWorkflow({ ..., handler })` is both at once, for a workflow whose
 * callers may import its handler. A worker hosting an implementation
 * registers it in the workflow catalog; the API then validates each run's
 * input against the definition's input as JSON Schema, without loading
 * this code, and the worker checks each result against `output` before it
 * completes the run. `name@version` is immutable once registered: change
 * anything of the definition under a new version.
 *
 * @module
 */
import { z } from "zod";
import type { Logger } from "../core/log.ts";
import { WORKFLOW_NAME_PATTERN } from "../contracts/runs.ts";
import { type ConcurrencyLimit, concurrencyProblem } from "../contracts/concurrency.ts";
import { type DebounceOptions, debounceProblem } from "../contracts/debounce.ts";
import { parseTenantScope } from "../contracts/tenant_scope.ts";
import type {
  ScheduleDeclaration,
  Schema,
  SignalSchemas,
  WorkflowDefinition,
} from "../contracts/workflow.ts";
import { SIGNAL_NAME_PATTERN } from "../contracts/signals.ts";
import { checkedSchedules } from "./schedules.ts";

export type { ConcurrencyLimit } from "../contracts/concurrency.ts";
export type { DebounceOptions } from "../contracts/debounce.ts";
export type {
  DeclaredSchedule,
  ScheduleDeclaration,
  Schema,
  SignalPayload,
  SignalSchemas,
  WorkflowDefinition,
  WorkflowInput,
  WorkflowResult,
} from "../contracts/workflow.ts";
import type { DurableContext } from "./durable.ts";
export { ChildRunFailed } from "./durable.ts";
export type {
  ChildRun,
  DurableContext,
  MapOptions,
  Signal,
  StartOptions,
  StepOptions,
  WaitForSignalOptions,
} from "./durable.ts";

export type { Fields, Logger } from "../core/log.ts";

/** What `input` takes (a zod 4 schema); `Schema` names both sides. */
export type InputSchema<I> = Schema<I, unknown>;

/**
 * What a handler gets besides its input: who it runs for, and the durable
 * calls (`step`, `stepKey`, `sleep`, `sleepUntil`, `waitForSignal`:
 * workflows/durable.ts).
 */
export interface WorkflowContext<S extends SignalSchemas = SignalSchemas>
  extends DurableContext<S> {
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

/**
 * A workflow's code: gets the parsed input, returns the result (JSON, of
 * the output schema's input side when the definition has one), or throws
 * to fail the attempt (retried while attempts remain).
 */
export type WorkflowHandler<I = unknown, R = unknown, S extends SignalSchemas = SignalSchemas> = (
  input: I,
  ctx: WorkflowContext<S>,
) => R | Promise<R>;

/** One version of one workflow, without its handler: what `defineWorkflow` takes. */
export interface DefinitionOptions<
  I = unknown,
  O = unknown,
  In = I,
  OIn = O,
  S extends SignalSchemas = SignalSchemas,
> {
  /** `[a-z][a-z0-9_.-]{0,99}`, e.g. `billing.invoice`. */
  name: string;
  /**
   * An integer from 1; a run names `name` (its current version:
   * docs/workflows.md) or
   * `name@version`. The typed client always pins the definition's.
   */
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
  input: Schema<I, In>;
  /**
   * The result's zod 4 schema; unset: any JSON. The worker parses what the
   * handler returns with it before completing the run and stores the parsed
   * value (unknown keys of a `z.object` dropped, transforms applied), so a
   * caller's result is of this type; a result that fails it ends the run
   * `failed` with code `invalid-output`, at once. Registered in the catalog
   * as JSON Schema (the output side). Keep it to what JSON can carry: a
   * `z.date()` is stored as its JSON text, and typed as a `Date` anyway.
   */
  output?: Schema<O, OIn>;
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
   * limit is per workflow name: a version declaring another limit or key
   * than the current version's is refused when a worker registers it.
   */
  concurrency?: ConcurrencyLimit;
  /**
   * Debounce (milliseconds): a request for a key (a JSON Pointer into the
   * input, as `concurrency.key`; unset: one per tenant) whose run is still
   * pending (queued, never started) joins that run instead of making one:
   * the run's input becomes the request's, and its start moves to `period`
   * after this request, never past `maxWait` after the first request of the
   * burst. Once the run started, the next request starts a new burst. A
   * request whose `dispatch_key` a run holds is a replay, as always.
   * Registered in the catalog with the version (docs/workflows.md#debounce).
   */
  debounce?: DebounceOptions;
  /**
   * The tenants that may start this version: tenant ids and prefixes
   * (`["acme", "team-*"]`, contracts/tenant_scope.ts); unset (or `["*"]`):
   * every tenant. Registered in the catalog with the version; the API
   * answers any other tenant's run of it as an unknown workflow (422) and
   * never names it to them. A run naming the workflow without a version
   * gets the current version, or the newest older one its tenant may start.
   */
  tenants?: readonly string[];
  /**
   * The signals the workflow waits for, each name's payload as a zod 4
   * schema (`{ approval: z.object({ ok: z.boolean() }) }`): registered in
   * the catalog as JSON Schema (the input side), the API refuses a signal
   * of a declared name whose payload fails it (422 naming the field), and
   * `ctx.waitForSignal("approval")` is typed by it. A name not declared
   * takes any payload. Names as signals' (1-200 characters, no `#`).
   */
  signals?: S;
  /**
   * Recurring runs of this version (`[{ id: "nightly", cron: "30 2 * * *",
   * timezone: "Europe/Paris", input: {...} }]`), each once per tenant it
   * names (`tenants`, or else the definition's `tenants` when those are ids):
   * a worker registering the version creates or updates them, as schedules
   * of `/v1/schedules` marked `origin: "definition"`. Checked here: a bad
   * cron, zone or input throws, naming the schedule. The workflow's newest
   * registered version decides its declared schedules (docs/workflows.md).
   */
  schedules?: readonly ScheduleDeclaration<NoInfer<In>>[];
}

/** The signals of a workflow that declares none: each wait names its payload's type. */
export type NoSignals = Record<never, never>;

/** A definition with its handler: the one-call form of `defineWorkflow`. */
export interface WorkflowOptions<
  I = unknown,
  O = unknown,
  In = I,
  OIn = O,
  S extends SignalSchemas = SignalSchemas,
> extends DefinitionOptions<I, O, In, OIn, S> {
  /** Returns the run's result (JSON), or throws to fail the attempt (retried while attempts remain). */
  handler: WorkflowHandler<I, NoInfer<OIn>, NoInfer<S>>;
}

/**
 * A workflow version a worker hosts: a definition with its handler, made by
 * `implement` (or `defineWorkflow` given a handler). It is a definition
 * too: the typed client takes it as well.
 */
export interface Workflow<
  I = unknown,
  O = unknown,
  In = I,
  OIn = O,
  S extends SignalSchemas = SignalSchemas,
> extends WorkflowDefinition<I, O, In, OIn, S> {
  /** The workflow's code. */
  readonly handler: WorkflowHandler<I, OIn, S>;
}

// Marks what defineWorkflow made, across copies of this module (a project
// and the package it imports may each load one).
const DEFINED: unique symbol = Symbol.for("poimen.workflow");

/**
 * Defines one version of a workflow. Without `handler`: a handler-free
 * definition, for producers and for `implement`. With `handler`: the
 * definition implemented at once (`implement(defineWorkflow(rest),
 * handler)`). Throws a `TypeError` naming the workflow when any part of it
 * is invalid, so a bad definition fails where it is imported.
 */
export function defineWorkflow<
  I,
  O = unknown,
  In = I,
  OIn = O,
  S extends SignalSchemas = NoSignals,
>(
  options: WorkflowOptions<I, O, In, OIn, S>,
): Workflow<I, O, In, OIn, S>;
/** Defines one version of a workflow without its handler; see the other form. */
export function defineWorkflow<
  I,
  O = unknown,
  In = I,
  OIn = O,
  S extends SignalSchemas = NoSignals,
>(
  // `handler?: undefined`: options whose handler does not fit fail here too,
  // rather than pass as a definition.
  options: DefinitionOptions<I, O, In, OIn, S> & { handler?: undefined },
): WorkflowDefinition<I, O, In, OIn, S>;
export function defineWorkflow(
  options: DefinitionOptions & { handler?: unknown },
): WorkflowDefinition | Workflow {
  const definition = checkedDefinition(options);
  if (!("handler" in options) || options.handler === undefined) return definition;
  return implement(definition, options.handler as WorkflowHandler);
}

/**
 * The implementation of `definition` by `handler`: what a worker hosts
 * (`runWorker`, `createWorker`, `deno task worker --workflows`). Its
 * handler's input and result are typed by the definition. Throws a
 * `TypeError` naming the workflow when `definition` was not made by
 * `defineWorkflow` or `handler` is not a function.
 */
export function implement<I, O, In, OIn, S extends SignalSchemas>(
  definition: WorkflowDefinition<I, O, In, OIn, S>,
  handler: WorkflowHandler<I, NoInfer<OIn>, NoInfer<S>>,
): Workflow<I, O, In, OIn, S> {
  if (!isWorkflowDefinition(definition)) {
    throw new TypeError("implement: the definition must be made by defineWorkflow");
  }
  if (typeof handler !== "function") {
    throw new TypeError(
      `workflow ${definition.name}@${definition.version}: handler must be a function`,
    );
  }
  const { name, version, input, output, maxAttempts, concurrency, debounce, tenants } = definition;
  const { inputSchema, outputSchema, signals, signalSchemas, schedules } = definition;
  return Object.freeze({
    name,
    version,
    input,
    output,
    maxAttempts,
    concurrency,
    debounce,
    tenants,
    inputSchema,
    outputSchema,
    signals,
    signalSchemas,
    schedules,
    handler,
    [DEFINED]: true,
  }) as Workflow<I, O, In, OIn, S>;
}

/** Whether `value` is a workflow a worker can host: made by `implement` or `defineWorkflow` with a handler. */
export function isWorkflow(value: unknown): value is Workflow {
  return isWorkflowDefinition(value) &&
    typeof (value as { handler?: unknown }).handler === "function";
}

/** Whether `value` was made by `defineWorkflow` (in any copy of this module), with or without handler. */
export function isWorkflowDefinition(value: unknown): value is WorkflowDefinition {
  return typeof value === "object" && value !== null &&
    (value as Record<symbol, unknown>)[DEFINED] === true;
}

/** `options` checked and frozen, with its schemas as JSON Schema; throws a `TypeError` naming it. */
function checkedDefinition(options: DefinitionOptions): WorkflowDefinition {
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
  if (options.debounce !== undefined) {
    const problem = debounceProblem(options.debounce);
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
  if (!isZodLike(options.input)) {
    throw new TypeError(`workflow ${label}: input must be a zod schema`);
  }
  if (options.output !== undefined && !isZodLike(options.output)) {
    throw new TypeError(`workflow ${label}: output must be a zod schema`);
  }
  const signals = checkedSignals(label, options.signals);
  const schedules = checkedSchedules(label, options.schedules, tenants, options.input);
  return Object.freeze({
    name: options.name,
    version: options.version,
    input: options.input,
    output: options.output,
    maxAttempts: max,
    concurrency: options.concurrency === undefined ? undefined : Object.freeze({
      limit: options.concurrency.limit,
      ...(options.concurrency.key === undefined ? {} : { key: options.concurrency.key }),
    }),
    debounce: options.debounce === undefined ? undefined : Object.freeze({
      period: options.debounce.period,
      maxWait: options.debounce.maxWait,
      ...(options.debounce.key === undefined ? {} : { key: options.debounce.key }),
    }),
    tenants,
    inputSchema: Object.freeze(jsonSchema(options.input, "input")),
    outputSchema: options.output === undefined
      ? undefined
      : Object.freeze(jsonSchema(options.output, "output")),
    signals: signals && Object.freeze({ ...options.signals }),
    signalSchemas: signals && Object.freeze(
      Object.fromEntries(signals.map(([name, schema]) => [
        name,
        Object.freeze(jsonSchema(schema, "input")),
      ])),
    ),
    schedules,
    [DEFINED]: true,
  });
}

/** The declared signals, checked (names, zod schemas); undefined when none. */
function checkedSignals(
  label: string,
  signals: unknown,
): [string, Schema][] | undefined {
  if (signals === undefined) return undefined;
  if (typeof signals !== "object" || signals === null || Array.isArray(signals)) {
    throw new TypeError(`workflow ${label}: signals must be an object of zod schemas by name`);
  }
  const entries = Object.entries(signals as Record<string, unknown>);
  for (const [name, schema] of entries) {
    if (!SIGNAL_NAME_PATTERN.test(name)) {
      throw new TypeError(
        `workflow ${label}: signal ${
          JSON.stringify(name)
        }: 1-200 characters, without # or control characters`,
      );
    }
    if (!isZodLike(schema)) {
      throw new TypeError(`workflow ${label}: signal ${name} must be a zod schema`);
    }
  }
  return entries.length === 0 ? undefined : entries as [string, Schema][];
}

/**
 * One side of a zod schema as JSON Schema: the input side of an input (what
 * a caller sends), the output side of an output (what the worker stores).
 * Unrepresentable parts (dates, custom types) become `{}`, which admits
 * anything: the worker's parse with the full schema is the last word.
 */
function jsonSchema(schema: unknown, io: "input" | "output"): Record<string, unknown> {
  return z.toJSONSchema(schema as z.ZodType, { io, unrepresentable: "any" }) as Record<
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
