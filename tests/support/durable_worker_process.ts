/**
 * A worker process of tests/support/durable_worker.ts, as the durable and
 * child-run integration tests start it (and kill it).
 */
import { PROJECT_ROOT } from "../../dev/tasks.ts";
import type { TestDatabase } from "./db.ts";

/** A worker process of tests/support/durable_worker.ts. */
export class DurableWorker {
  readonly id: string;
  readonly #child: Deno.ChildProcess;
  readonly #stderr: Promise<string>;
  readonly done: Promise<Deno.CommandStatus>;

  constructor(db: TestDatabase, id: string, env: Record<string, string> = {}) {
    this.id = id;
    this.#child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--no-prompt",
        "--allow-net",
        "--allow-env",
        "--allow-sys=hostname",
        "tests/support/durable_worker.ts",
      ],
      cwd: PROJECT_ROOT,
      env: {
        NO_COLOR: "1",
        DATABASE_URL: db.url,
        SIDE_EFFECTS_URL: db.url,
        WORKER_ID: id,
        WORKER_LEASE_MS: "2000",
        WORKER_POLL_MS: "100",
        WORKER_METRICS_PORT: "0",
        LOG_LEVEL: "warn",
        ...env,
      },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    this.#stderr = new Response(this.#child.stderr).text();
    this.done = this.#child.status;
  }

  async kill(signal: Deno.Signal): Promise<{ code: number; stderr: string }> {
    try {
      this.#child.kill(signal);
    } catch { /* already gone */ }
    const [status, stderr] = await Promise.all([this.done, this.#stderr]);
    return { code: status.code, stderr };
  }
}
