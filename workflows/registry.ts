/**
 * A worker's workflows: the versions it hosts, looked up by the version a
 * run was pinned to at admission, so a new version never changes a run in
 * flight. What the worker registers in the catalog (db/catalog.ts) and
 * claims by (db/claims.ts) comes from here.
 */
import type { CatalogVersion } from "../db/catalog.ts";
import type { HostedVersions } from "../db/claims.ts";
import {
  defineWorkflow,
  isWorkflow,
  isWorkflowDefinition,
  type Workflow,
  type WorkflowOptions,
} from "./define.ts";

export type { Workflow, WorkflowContext } from "./define.ts";

export class WorkflowRegistry {
  // `name@version` → definition
  // deno-lint-ignore no-explicit-any
  readonly #byRef = new Map<string, Workflow<any>>();

  /**
   * A registry of `workflows` (implementations); one `name@version` twice,
   * or a definition without a handler, is a `TypeError` naming it.
   */
  // deno-lint-ignore no-explicit-any
  constructor(workflows: Iterable<Workflow<any> | WorkflowOptions<any>> = []) {
    for (const wf of workflows) this.register(wf);
  }

  /**
   * Adds one implemented version (plain options with a handler are passed
   * through `defineWorkflow`).
   */
  // deno-lint-ignore no-explicit-any
  register(wf: Workflow<any> | WorkflowOptions<any>): this {
    // Checked at run time too: a caller without types may pass a bare definition.
    const defined: unknown = isWorkflowDefinition(wf) ? wf : defineWorkflow(wf);
    if (!isWorkflow(defined)) {
      const { name, version } = defined as { name: string; version: number };
      throw new TypeError(
        `workflow ${name}@${version} is a definition without a handler: ` +
          `a worker hosts implement(definition, handler)`,
      );
    }
    const ref = `${defined.name}@${defined.version}`;
    if (this.#byRef.has(ref)) throw new TypeError(`workflow ${ref} is given twice`);
    this.#byRef.set(ref, defined);
    return this;
  }

  /** The definition of `name@version`, or undefined when this worker does not host it. */
  // deno-lint-ignore no-explicit-any
  resolve(ref: string): Workflow<any> | undefined {
    return this.#byRef.get(ref);
  }

  /** Every hosted `name@version`, sorted. */
  list(): string[] {
    return [...this.#byRef.keys()].sort();
  }

  /** The hosted versions, as the claim takes them. */
  hosted(): HostedVersions {
    return versionsOf([...this.#byRef.values()]);
  }

  /**
   * The hosted versions split as the worker claims them: those without a
   * concurrency limit (db/claims.ts `claimRuns`) and those with one
   * (`claimLimitedRuns`).
   */
  hostedByLimit(): { unlimited: HostedVersions; limited: HostedVersions } {
    const all = [...this.#byRef.values()];
    return {
      unlimited: versionsOf(all.filter((w) => w.concurrency === undefined)),
      limited: versionsOf(all.filter((w) => w.concurrency !== undefined)),
    };
  }

  /** What the catalog stores of each hosted version. */
  catalogVersions(): CatalogVersion[] {
    return [...this.#byRef.values()].map((w) => ({
      name: w.name,
      version: w.version,
      input_schema: { ...w.inputSchema },
      output_schema: w.outputSchema === undefined ? null : { ...w.outputSchema },
      max_attempts: w.maxAttempts ?? null,
      concurrency_limit: w.concurrency?.limit ?? null,
      concurrency_key: w.concurrency?.key ?? null,
      debounce: w.debounce === undefined ? null : { ...w.debounce },
      tenants: w.tenants?.join(",") ?? null,
      signal_schemas: w.signalSchemas === undefined ? null : { ...w.signalSchemas },
      schedules: w.schedules === undefined ? null : [...w.schedules],
    }));
  }
}

// deno-lint-ignore no-explicit-any
function versionsOf(list: Workflow<any>[]): HostedVersions {
  return { names: list.map((w) => w.name), versions: list.map((w) => w.version) };
}
