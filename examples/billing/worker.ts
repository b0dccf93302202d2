/**
 * The billing worker: hosts the team's workflows until SIGTERM or SIGINT.
 * Configured by the environment, as `deno task worker` of poimen is
 * (DATABASE_URL, WORKER_CONCURRENCY, WORKER_METRICS_PORT, …).
 *
 *   DATABASE_URL=postgres://… deno task worker
 */
import { runWorker } from "@poimen/poimen/worker";
import { invoice, refund } from "./workflows.ts";

// Resolves after a graceful stop and sets Deno.exitCode (2: bad configuration).
await runWorker({ workflows: [invoice, refund] });
