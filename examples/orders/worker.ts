/**
 * The orders worker: hosts `shop.order@1` until SIGTERM or SIGINT.
 * Configured by the environment, as `deno task worker` of poimen is
 * (DATABASE_URL, WORKER_CONCURRENCY, WORKER_SUSPEND_AFTER_MS, …).
 *
 *   DATABASE_URL=postgres://… deno task worker
 */
import { runWorker } from "@poimen/poimen/worker";
import { order } from "./workflows.ts";

await runWorker({ workflows: [order] });
