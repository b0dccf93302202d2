/**
 * The fan-out worker: hosts `billing.month@1` and its children's
 * `billing.customer-month@1` until SIGTERM or SIGINT. Configured by the
 * environment, as `deno task worker` of poimen is (DATABASE_URL,
 * WORKER_CONCURRENCY, WORKER_SUSPEND_AFTER_MS, …).
 *
 *   DATABASE_URL=postgres://… deno task worker
 */
import { runWorker } from "@poimen/poimen/worker";
import { customerMonth, month } from "./workflows.ts";

await runWorker({ workflows: [month, customerMonth] });
