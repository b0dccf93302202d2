/** The worker's Prometheus metrics, on a registry of its own (never prom-client's global one). */
import client from "prom-client";
import type { Logger } from "../core/log.ts";
import { COUNT_CAP } from "../db/queue_overview.ts";
import { QUEUE_GAUGE_CAP, type QueueStats } from "../db/queue_stats.ts";
import type { WorkerHooks } from "./hooks.ts";

export type WorkerMetrics = ReturnType<typeof createWorkerMetrics>;

/**
 * Creates the worker's metrics on `registry`. Queue-wide gauges are read at
 * scrape time through `stats` (one query per scrape, shared by the gauges);
 * `stats` resolving with null means this process does not report them (it
 * is not the leader): they are left empty. `inFlight` reads this process's
 * runs in flight, `leader` whether it is the fleet's leader.
 */
export function createWorkerMetrics(
  registry: client.Registry,
  stats: () => Promise<QueueStats | null>,
  inFlight: () => number,
  log: Logger,
  leader: () => boolean = () => true,
) {
  const registers = [registry];
  // The gauges are collected concurrently: the first asks, the others share
  // its answer. undefined: the read failed (the gauges keep their last
  // answer); null: not this process's to report.
  let pending: Promise<QueueStats | null | undefined> | undefined;
  const fresh = () =>
    pending ??= stats()
      .catch((err) => {
        log.warn("queue stats failed", { error: err });
        return undefined;
      })
      .finally(() => setTimeout(() => pending = undefined, 0));

  const claims = new client.Counter({
    name: "poimen_worker_claims_total",
    help: "Runs claimed by this worker",
    registers,
  });
  const finished = new client.Counter({
    name: "poimen_worker_attempts_finished_total",
    help:
      "Attempts finished by this worker, by outcome: succeeded, retrying, failed, cancelled, released, suspended, lost",
    labelNames: ["outcome"] as const,
    registers,
  });
  const retries = new client.Counter({
    name: "poimen_worker_retries_total",
    help: "Failed attempts this worker scheduled for a retry",
    registers,
  });
  const reclaimed = new client.Counter({
    name: "poimen_worker_reclaimed_total",
    help: "Runs whose lease expired, taken back by this worker, by resulting status",
    labelNames: ["status"] as const,
    registers,
  });
  const fenced = new client.Counter({
    name: "poimen_worker_fenced_total",
    help:
      "Lease renewals (per run) and finishing writes refused because their attempt no longer held the lease, by statement: heartbeat, complete, fail, release",
    labelNames: ["statement"] as const,
    registers,
  });
  const heartbeatTimeouts = new client.Counter({
    name: "poimen_worker_heartbeat_timeouts_total",
    help:
      "Lease renewals that did not answer in time and were cancelled (the leases were left unconfirmed)",
    registers,
  });
  const renewals = new client.Counter({
    name: "poimen_worker_lease_renewals_total",
    help:
      "Lease renewals that answered: one statement each, renewing every run this worker held then",
    registers,
  });
  new client.Gauge({
    name: "poimen_worker_runs_in_flight",
    help: "Runs this worker is executing",
    registers,
    collect() {
      this.set(inFlight());
    },
  });
  new client.Gauge({
    name: "poimen_worker_leader",
    help:
      "1 on the workers' elected leader (it reclaims expired leases and reports the queue-wide gauges), 0 elsewhere",
    registers,
    collect() {
      this.set(leader() ? 1 : 0);
    },
  });
  new client.Gauge({
    name: "poimen_runs",
    help:
      `Runs queued and running (all tenants), each counted up to ${QUEUE_GAUGE_CAP} (poimen_runs_at_cap says when more); reported by the leader only; finished runs are counted by completions`,
    labelNames: ["status"] as const,
    registers,
    async collect() {
      const s = await fresh();
      if (s === null) return this.reset();
      if (!s) return;
      for (const [status, n] of Object.entries(s.byStatus)) this.set({ status }, n);
    },
  });
  new client.Gauge({
    name: "poimen_runs_at_cap",
    help:
      "1 when poimen_runs of that status reached its cap: there are at least that many runs, maybe more; reported by the leader only",
    labelNames: ["status"] as const,
    registers,
    async collect() {
      const s = await fresh();
      if (s === null) return this.reset();
      if (!s) return;
      for (const [status, at] of Object.entries(s.capped)) this.set({ status }, at ? 1 : 0);
    },
  });
  new client.Gauge({
    name: "poimen_queue_oldest_due_age_seconds",
    help:
      "Age of the oldest of the tenants' next due runs (highest priority first; 0 when none): how far behind the workers are; 0 except on the leader",
    registers,
    async collect() {
      const s = await fresh();
      if (s === null) return this.set(0);
      if (s) this.set(s.oldestQueuedAgeSeconds);
    },
  });
  new client.Gauge({
    name: "poimen_runs_waiting_for_worker",
    help:
      `Queued runs (all tenants, at most ${COUNT_CAP} per version) of a workflow version no live worker hosts, by workflow (name@version)`,
    labelNames: ["workflow"] as const,
    registers,
    async collect() {
      const s = await fresh();
      if (s === null) return this.reset();
      // A failed read keeps the last answer, as the gauges above do.
      if (!s) return;
      // Only what this scrape found: a version that got a worker, or whose
      // runs are gone, disappears instead of repeating its last count.
      this.reset();
      for (const q of s.waitingForWorker) this.set({ workflow: q.workflow }, q.runs);
    },
  });
  // Per tenant and limited workflow, from concurrency_slots' exact counts.
  // As above, only what this scrape found: a workflow with nothing running
  // or waiting disappears from both.
  new client.Gauge({
    name: "poimen_runs_waiting_on_concurrency",
    help:
      "Queued runs (due or not) of concurrency groups at their limit, by tenant and workflow: runs a concurrency limit holds back",
    labelNames: ["tenant", "workflow"] as const,
    registers,
    async collect() {
      const s = await fresh();
      if (s === null) return this.reset();
      if (!s) return;
      this.reset();
      for (const l of s.limited) this.set({ tenant: l.tenant, workflow: l.workflow }, l.waiting);
    },
  });
  new client.Gauge({
    name: "poimen_runs_running_limited",
    help: "Running runs of workflows with a concurrency limit, by tenant and workflow",
    labelNames: ["tenant", "workflow"] as const,
    registers,
    async collect() {
      const s = await fresh();
      if (s === null) return this.reset();
      if (!s) return;
      this.reset();
      for (const l of s.limited) this.set({ tenant: l.tenant, workflow: l.workflow }, l.running);
    },
  });

  new client.Gauge({
    name: "poimen_runs_waiting",
    help:
      `Waiting runs (suspended, all tenants) by what they wait for: sleep (a long ctx.sleep), signal (ctx.waitForSignal) or children (result(), ctx.map), each counted up to ${QUEUE_GAUGE_CAP}; reported by the leader only`,
    labelNames: ["reason"] as const,
    registers,
    async collect() {
      const s = await fresh();
      if (s === null) return this.reset();
      if (!s) return;
      for (const [reason, n] of Object.entries(s.waitingByReason)) this.set({ reason }, n);
    },
  });
  const stepDuration = new client.Histogram({
    name: "poimen_worker_step_duration_seconds",
    help:
      "Durable calls this worker ended, by kind (step, sleep, signal) and outcome (completed, failed): a step's time in its fn (its tries included), a sleep's or wait's in this worker",
    labelNames: ["kind", "outcome"] as const,
    buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300],
    registers,
  });
  const suspended = new client.Counter({
    name: "poimen_worker_suspended_total",
    help:
      "Runs this worker suspended (waiting for a long sleep's end, a signal or its children), by reason",
    labelNames: ["reason"] as const,
    registers,
  });
  const woken = new client.Counter({
    name: "poimen_worker_woken_total",
    help:
      "Waiting runs this worker (as the leader) queued at their deadline: a sleep's end or a wait's timeout",
    registers,
  });

  const hooks: WorkerHooks = {
    onClaimed: (n) => claims.inc(n),
    onFinished: (outcome) => {
      finished.inc({ outcome });
      if (outcome === "retrying") retries.inc();
    },
    onReclaimed: (runs) => {
      for (const r of runs) reclaimed.inc({ status: r.status });
    },
    onFenced: (statement) => fenced.inc({ statement }),
    onHeartbeatTimeout: () => heartbeatTimeouts.inc(),
    onLeasesRenewed: () => renewals.inc(),
    onStepFinished: (kind, outcome, seconds) => stepDuration.observe({ kind, outcome }, seconds),
    onSuspended: (reason) => suspended.inc({ reason }),
    onWoken: (n) => woken.inc(n),
  };
  return { registry, hooks };
}
