/** The defaults of the durable calls' settings (worker/config.ts, worker/worker.ts). */
import { SECOND } from "../core/time.ts";

/** Default of WORKER_SUSPEND_AFTER_MS: a sleep or wait with more left suspends the run. */
export const DEFAULT_SUSPEND_AFTER_MS = 5 * SECOND;

/** Default of RUN_STEP_MAX_BYTES: 256 KiB. */
export const DEFAULT_RUN_STEP_MAX_BYTES = 256 * 1024;
