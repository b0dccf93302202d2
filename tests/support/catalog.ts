/** Admission's view of a set of workflows, as the API would have it from the catalog. */
import { z } from "zod";
import { StaticCatalog } from "../../admission/catalog.ts";
import { defineWorkflow } from "../../workflows/define.ts";
import { builtinRegistry } from "../../workflows/builtin.ts";
import type { WorkflowRegistry } from "../../workflows/registry.ts";
import type { HostedVersions } from "../../db/claims.ts";

/** What an API validates against when `registry`'s workers have registered (the built-ins by default). */
export function catalogOf(registry: WorkflowRegistry = builtinRegistry()): StaticCatalog {
  return new StaticCatalog(registry.catalogVersions());
}

/** The built-in versions as a claim takes them (a worker hosting the built-ins). */
export const BUILTIN_HOSTED: HostedVersions = builtinRegistry().hosted();

/**
 * A workflow limited to one running run per `customer_id` (`shop.sync@1`),
 * with the built-ins beside it in `limitedRegistry()`: what the flow control
 * tests admit and claim.
 */
export const perCustomer = defineWorkflow({
  name: "shop.sync",
  version: 1,
  input: z.object({ customer_id: z.string(), n: z.number() }),
  concurrency: { limit: 1, key: "/customer_id" },
  handler: () => Promise.resolve(null),
});

/** The built-ins and `perCustomer`. */
export function limitedRegistry(): WorkflowRegistry {
  return builtinRegistry().register(perCustomer);
}
