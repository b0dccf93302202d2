/**
 * A real worker process on the process harness (core/process_harness.ts):
 * the first SIGTERM waits for the run in flight, a second forces the exit at
 * once; a part that cannot start ends the process with code 1 and one line.
 */
import assert from "node:assert/strict";
import { REPEATED_SIGNAL_MS } from "../core/process_harness.ts";
import { Admission } from "../admission/admit.ts";
import { insertTenant } from "../db/auth.ts";
import { MINUTE, SECOND } from "../core/time.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { PoimenProcess } from "./support/processes.ts";

/** The JSON log lines of `proc` whose `msg` is `msg`. */
function logged(proc: PoimenProcess, msg: string): Record<string, unknown>[] {
  return proc.logs().flatMap((line) => {
    try {
      const entry = JSON.parse(line);
      return entry?.msg === msg ? [entry] : [];
    } catch {
      return [];
    }
  });
}

Deno.test("process stop: a second SIGTERM ends a worker that waits for its run in flight", async () => {
  const db = await freshDatabase();
  await insertTenant(db.sql, "t");
  const admission = new Admission(db.sql, catalogOf(), { maxBatch: 1, maxConcurrent: 1 });
  // Longer than the test: only a forced exit ends the graceful wait for it.
  const { run } = await admission.admit({ workflow_ref: "sleep", input: { ms: 10 * MINUTE } }, {
    tenantId: "t",
    source: "test",
    entry: "http",
  });
  const worker = new PoimenProcess("worker", {
    DATABASE_URL: db.url,
    LOG_LEVEL: "info",
    WORKER_POLL_MS: "100",
    WORKER_SHUTDOWN_MS: String(10 * MINUTE),
  });
  try {
    await waitFor("the run running", async () => {
      if (worker.exited) throw new Error(`worker exited:\n${worker.logs().join("\n")}`);
      const [row] = await db.sql<{ status: string }[]>`
        select status from runs where run_id = ${run.run_id}`;
      return row?.status === "running";
    });

    Deno.kill(worker.pid, "SIGTERM");
    const firstAt = Date.now();
    await waitFor(
      "the worker waiting for its run",
      () => logged(worker, "waiting for runs in flight").length > 0,
      30 * SECOND,
    );
    assert.equal(worker.exited, false, "the first SIGTERM is a graceful stop");
    // Sooner, it would be taken for the first delivered twice (REPEATED_SIGNAL_MS).
    await waitFor("the repeat window over", () => Date.now() - firstAt > REPEATED_SIGNAL_MS);

    const asked = Date.now();
    // Killed (code 137) if it has not exited 10 s after the second signal.
    const status = await worker.stop("SIGTERM", 10 * SECOND);
    const logs = worker.logs().join("\n");
    assert.equal(status.code, 143, logs);
    assert.ok(Date.now() - asked < 10 * SECOND, logs);
    const forced = logged(worker, "forced exit");
    assert.equal(forced.length, 1, logs);
    assert.deepEqual(forced[0].did_not_stop, ["worker"]);
    assert.equal(forced[0].reason, "second SIGTERM");
  } finally {
    await worker.stop("SIGKILL");
    await db.drop();
  }
});

Deno.test("process stop: a worker whose metrics port is taken exits 1 with one line", async () => {
  const db = await freshDatabase();
  const taken = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const worker = new PoimenProcess("worker", {
    DATABASE_URL: db.url,
    LOG_LEVEL: "warn",
    WORKER_METRICS_PORT: String((taken.addr as Deno.NetAddr).port),
  });
  try {
    await waitFor("the worker exits", () => worker.exited, 30 * SECOND);
    const status = await worker.status();
    const lines = worker.logs().filter((l) => l.trim() !== "");
    assert.equal(status.code, 1, lines.join("\n"));
    assert.equal(lines.length, 1, lines.join("\n"));
    const [failed] = logged(worker, "start failed");
    assert.equal(failed?.part, "metrics server", lines.join("\n"));
    assert.match(JSON.stringify(failed.error), /in use/i);
  } finally {
    await worker.stop("SIGKILL");
    taken.close();
    await db.drop();
  }
});
