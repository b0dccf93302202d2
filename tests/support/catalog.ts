/** Admission's view of a set of workflows, as the API would have it from the catalog. */
import { StaticCatalog } from "../../admission/catalog.ts";
import { builtinRegistry } from "../../workflows/builtin.ts";
import type { WorkflowRegistry } from "../../workflows/registry.ts";
import type { HostedVersions } from "../../db/claims.ts";

/** What an API validates against when `registry`'s workers have registered (the built-ins by default). */
export function catalogOf(registry: WorkflowRegistry = builtinRegistry()): StaticCatalog {
  return new StaticCatalog(registry.catalogVersions());
}

/** The built-in versions as a claim takes them (a worker hosting the built-ins). */
export const BUILTIN_HOSTED: HostedVersions = builtinRegistry().hosted();
