/**
 * What the queue-shape sections (spread, idle, claim, soak; issue 28) share:
 * tenants in bulk, runs admitted through the kernel in bulk, and a real
 * worker process started and awaited. They measure from outside (admit,
 * run the worker, time the drain), so they measure whatever claim is merged.
 */
import type { Sql } from "../db/pool.ts";
import { Admission, type AdmitRequest } from "../admission/admit.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { StaticCatalog } from "../admission/catalog.ts";
import { PoimenProcess } from "../dev/processes.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { keyed } from "./keyed_workflows.ts";
import { waitHttp } from "./scenario_support.ts";

/** Inserts tenants `ids` in one statement (existing ones are left alone). */
export async function insertTenants(sql: Sql, ids: string[]): Promise<void> {
  for (let i = 0; i < ids.length; i += 10_000) {
    await sql`insert into tenants (tenant_id) select unnest(${ids.slice(i, i + 10_000)}::text[])
              on conflict (tenant_id) do nothing`;
  }
}

/** The admission kernel on `sql`, knowing the built-ins and bench.keyed. */
export function benchKernel(sql: Sql): Admission {
  return new Admission(
    sql,
    new StaticCatalog(builtinRegistry().register(keyed).catalogVersions()),
    { maxBatch: 500, maxConcurrent: 2 },
  );
}

/** One run to admit: its tenant and request. */
export interface BenchRun {
  tenant: string;
  req: AdmitRequest;
}

/** Admits every run of `runs(i)` for i < n through the kernel, 2,000 at a time (a refusal throws). */
export async function admitAll(
  kernel: Admission,
  n: number,
  runs: (i: number) => BenchRun,
): Promise<void> {
  for (let i = 0; i < n; i += 2000) {
    await Promise.all(
      Array.from({ length: Math.min(2000, n - i) }, (_, j) => {
        const { tenant, req } = runs(i + j);
        return kernel.admit(req, { tenantId: tenant, source: "bench", entry: "http" });
      }),
    );
  }
}

/** Workflows module of a bench worker, from bench/ (undefined: the built-ins). */
function workflowsArgs(module?: string): string[] {
  return module ? ["--workflows", `${PROJECT_ROOT}bench/${module}`] : [];
}

/** A worker process (concurrency 16) on `url`, answering /readyz. */
export async function readyWorker(url: string, module?: string): Promise<PoimenProcess> {
  const worker = new PoimenProcess("worker", {
    DATABASE_URL: url,
    WORKER_CONCURRENCY: "16",
    LOG_LEVEL: "error",
  }, workflowsArgs(module));
  try {
    await waitHttp(`${worker.metricsUrl}/readyz`, "worker");
  } catch (err) {
    await worker.stop();
    throw new Error(`${err}:\n${worker.logs().join("\n")}`);
  }
  return worker;
}

/** The `p` quantile of `xs` (any order); 0 when empty. */
export function quantile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? 0 : s[Math.min(s.length - 1, Math.floor(p * s.length))];
}

/**
 * Polls `ok` every 100 ms until it holds; throws naming `what` once
 * `worker` exited (read at each poll) or `limitMs` passed.
 */
export async function untilOrStalled(
  worker: PoimenProcess,
  ok: () => Promise<boolean>,
  what: string,
  limitMs: number,
): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!(await ok())) {
    if (worker.exited || Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
