/**
 * What a workflow definition is, as types only: the shape of a zod 4 schema
 * that poimen reads, the handler-free definition `defineWorkflow` returns
 * (workflows/define.ts), and the types a caller derives from a definition.
 * No runtime code and no dependency, so the client (client/) types its
 * calls by a definition without loading zod, and a producer imports a
 * team's definitions without their handlers.
 *
 * @module
 */
import type { ConcurrencyLimit } from "./concurrency.ts";
import type { DebounceOptions } from "./debounce.ts";

export type { ConcurrencyLimit, DebounceOptions };

/**
 * What `input` and `output` take: a zod 4 schema (`z.object({...})` and the
 * like), of any copy of zod 4, seen by what poimen uses of it: `safeParse`,
 * and the input and output types zod keeps on `_zod`. `Out` is what parsing
 * gives, `In` what it accepts (they differ under `.transform()`,
 * `.default()`, `z.coerce`).
 */
export interface Schema<Out = unknown, In = Out> {
  /** zod's `safeParse`: the parsed value, or the issues. */
  safeParse(value: unknown):
    | { success: true; data: Out }
    | { success: false; error: { issues: readonly { path: PropertyKey[]; message: string }[] } };
  /** zod's internals; poimen reads only the types of `input` and `output` from here. */
  readonly _zod: { readonly output: Out; readonly input: In };
}

/** The signals a workflow declares: each signal name's payload schema (a zod 4 schema). */
export type SignalSchemas = { readonly [name: string]: Schema };

/** The payload of signal `N` of signals `S`: its schema's input side (what the API checked); unknown when undeclared. */
export type SignalPayload<S, N extends string> = S extends {
  readonly [K in N]: { readonly _zod: { readonly input: infer P } };
} ? P
  : unknown;

/**
 * One version of one workflow without its handler: what `defineWorkflow`
 * returns when given no handler. A producer imports it to start runs with
 * the typed client (`client.start(definition, input)`); a worker hosts it
 * once implemented (`implement(definition, handler)`). Type parameters:
 * `I` the input as the handler gets it (parsed), `O` the result as the
 * caller gets it, `In` the input as a caller sends it, `OIn` the result as
 * the handler returns it; `In` and `OIn` differ from `I` and `O` only
 * under transforms, defaults and coercions.
 */
export interface WorkflowDefinition<
  I = unknown,
  O = unknown,
  In = I,
  OIn = O,
  S extends SignalSchemas = SignalSchemas,
> {
  /** `[a-z][a-z0-9_.-]{0,99}`, e.g. `billing.invoice`. */
  readonly name: string;
  /** An integer from 1. */
  readonly version: number;
  /** The input's zod schema. */
  readonly input: Schema<I, In>;
  /** The result's zod schema, checked by the worker before it completes a run; unset: any JSON. */
  readonly output?: Schema<O, OIn>;
  /** Attempts before the run is `failed`; unset: the API's DEFAULT_MAX_ATTEMPTS. */
  readonly maxAttempts?: number;
  /** At most `limit` runs running at once per tenant, or per value of `key`. */
  readonly concurrency?: ConcurrencyLimit;
  /** The requests for one key make one run, `period` ms after the last, at most `maxWait` ms after the first. */
  readonly debounce?: DebounceOptions;
  /** The tenants that may start this version (ids and `prefix*`); unset: every tenant. */
  readonly tenants?: readonly string[];
  /** The input as JSON Schema (draft 2020-12, the input side), as the catalog stores it. */
  readonly inputSchema: Readonly<Record<string, unknown>>;
  /** The output as JSON Schema (draft 2020-12, the output side), as the catalog stores it. */
  readonly outputSchema?: Readonly<Record<string, unknown>>;
  /** The signals it declares, each name's payload schema; unset: none (any payload). */
  readonly signals?: S;
  /** Each declared signal's payload as JSON Schema (the input side), as the catalog stores it. */
  readonly signalSchemas?: Readonly<Record<string, Readonly<Record<string, unknown>>>>;
  /** The schedules it declares, checked, each with its tenants; unset: none. */
  readonly schedules?: readonly DeclaredSchedule<In>[];
}

/**
 * A schedule a workflow declares (`schedules` of `defineWorkflow`): a run of
 * the declaring version with `input` at each occurrence of `cron` in
 * `timezone`, for each of `tenants` (docs/workflows.md#declared-schedules).
 * `In` is the input as a caller sends it.
 */
export interface ScheduleDeclaration<In = unknown> {
  /** The schedule's id within each tenant: 1–100 of `A-Z a-z 0-9 . _ -`. */
  readonly id: string;
  /** 5 fields: minute hour day-of-month month day-of-week (`30 2 * * *`). */
  readonly cron: string;
  /** An IANA time zone; unset: `UTC`. */
  readonly timezone?: string;
  /** Every occurrence's input, checked against the input schema when defined; unset: null. */
  readonly input?: In;
  /** `allow` (default) or `skip` while the last occurrence's run is unfinished. */
  readonly overlap?: "skip" | "allow";
  /** After downtime: `skip` (default), `latest` or `all`. */
  readonly catchup?: "skip" | "latest" | "all";
  /**
   * The tenants (ids, no prefixes) the schedule exists for, once each;
   * unset: the definition's `tenants`, which must then name ids only.
   */
  readonly tenants?: readonly string[];
}

/** A declared schedule as a definition keeps it: defaults applied, its tenants named. */
export interface DeclaredSchedule<In = unknown> {
  /** The schedule's id within each of its tenants. */
  readonly id: string;
  /** Its 5-field cron. */
  readonly cron: string;
  /** Its IANA time zone (`UTC` when the declaration gave none). */
  readonly timezone: string;
  /** As JSON carries it (null when the declaration gave none). */
  readonly input: In;
  /** Its overlap policy (`allow` when the declaration gave none). */
  readonly overlap: "skip" | "allow";
  /** Its catch-up policy (`skip` when the declaration gave none). */
  readonly catchup: "skip" | "latest" | "all";
  /** The tenants it exists for, sorted: the declaration's, or the definition's. */
  readonly tenants: readonly string[];
}

/** What a caller sends as the input of a run of `W` (a definition): its input schema's input side. */
export type WorkflowInput<W> = W extends {
  readonly input: { readonly _zod: { readonly input: infer In } };
} ? In
  : never;

/** The result of a succeeded run of `W` (a definition): `unknown` when it declares no output. */
export type WorkflowResult<W> = W extends {
  readonly output?: { readonly _zod: { readonly output: infer O } };
} ? O
  : never;
