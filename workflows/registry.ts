/**
 * The workflow registry: versioned TypeScript workflow definitions. The API
 * resolves `name@version` (or `name`, meaning the newest version) and pins
 * the version on the run at admission; the worker looks the pinned version
 * up again to execute it, so a new version never changes a run in flight.
 */
import type { z } from "zod";
import type { Logger } from "../core/log.ts";
import { WORKFLOW_NAME_PATTERN, WORKFLOW_REF_PATTERN } from "../contracts/runs.ts";

/** What a handler gets besides its input. */
export interface WorkflowContext {
  tenantId: string;
  runId: string;
  /** 1 on the first attempt. */
  attempt: number;
  /**
   * Aborted when the worker shuts down, loses the run's lease, or the run is
   * cancelled. A handler that honours it throws (the attempt then ends
   * `cancelled` or released); one that returns a result anyway succeeds.
   */
  signal: AbortSignal;
  log: Logger;
}

/** One version of one workflow. */
export interface Workflow<I = unknown> {
  name: string;
  version: number;
  /** Validates the run's input at admission (a mismatch is a 422) and again before execution. */
  input: z.ZodType<I>;
  /** Attempts before the run is `failed`; the default is the registry's. */
  maxAttempts?: number;
  /** Returns the run's result (JSON), or throws to fail the attempt. */
  handler(input: I, ctx: WorkflowContext): Promise<unknown>;
}

/** A resolved reference: the definition and the version to pin. */
export interface ResolvedWorkflow {
  name: string;
  version: number;
  maxAttempts: number;
  // deno-lint-ignore no-explicit-any
  workflow: Workflow<any>;
}

export class WorkflowRegistry {
  // name → versions, newest last
  // deno-lint-ignore no-explicit-any
  readonly #byName = new Map<string, Workflow<any>[]>();
  readonly #defaultMaxAttempts: number;

  constructor(defaultMaxAttempts = 3) {
    this.#defaultMaxAttempts = defaultMaxAttempts;
  }

  /** Adds one version; registering the same name and version twice is a programming error. */
  register<I>(wf: Workflow<I>): this {
    if (!WORKFLOW_NAME_PATTERN.test(wf.name)) throw new Error(`bad workflow name: ${wf.name}`);
    if (!Number.isInteger(wf.version) || wf.version < 1) {
      throw new Error(`bad workflow version: ${wf.name}@${wf.version}`);
    }
    const versions = this.#byName.get(wf.name) ?? [];
    if (versions.some((v) => v.version === wf.version)) {
      throw new Error(`workflow registered twice: ${wf.name}@${wf.version}`);
    }
    versions.push(wf);
    versions.sort((a, b) => a.version - b.version);
    this.#byName.set(wf.name, versions);
    return this;
  }

  /** Resolves `name` (newest version) or `name@version`; undefined when unknown. */
  resolve(ref: string): ResolvedWorkflow | undefined {
    const m = WORKFLOW_REF_PATTERN.exec(ref);
    if (!m) return undefined;
    const versions = this.#byName.get(m[1]);
    if (!versions) return undefined;
    const wf = m[2] === undefined
      ? versions[versions.length - 1]
      : versions.find((v) => v.version === Number(m[2]));
    if (!wf) return undefined;
    return {
      name: wf.name,
      version: wf.version,
      maxAttempts: wf.maxAttempts ?? this.#defaultMaxAttempts,
      workflow: wf,
    };
  }

  /** Every registered `name@version`, for docs and errors. */
  list(): string[] {
    return [...this.#byName.values()].flat().map((w) => `${w.name}@${w.version}`);
  }
}
