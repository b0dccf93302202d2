/**
 * The API's Prometheus metrics, on registries of their own (never
 * prom-client's global one): `registry` holds the series that name no
 * tenant (the API port's `/metrics` serves them to anyone), `tenantRegistry`
 * the per-tenant ones, served with the rest only on the metrics listener
 * (API_METRICS_HOST:API_METRICS_PORT, 127.0.0.1 by default).
 */
import client from "prom-client";
import type { MetricsSource } from "../core/metrics_server.ts";
import type { BodyBudget } from "./body_budget.ts";
import type { StreamStats } from "./run_watch.ts";
import type { QuotaRefusal, QuotaView } from "../admission/quota.ts";

export type ApiMetrics = ReturnType<typeof createApiMetrics>;

// The methods a `method` label may hold; any other (Deno accepts methods of
// tens of kilobytes, of any token) is "other", so no request can add series.
const METHODS = new Set(["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]);

/** A request's method as a label value: one of a fixed set, "other" for the rest. */
function methodLabel(method: string): string {
  return METHODS.has(method) ? method : "other";
}

/**
 * Creates the API's metrics on `registry` (tenant-free) and `tenantRegistry`
 * (series labelled by tenant; a new registry unless given). `observeRequest` and
 * `observeAdmission` reuse one labelled child per label set: prom-client
 * hashes the label set on every `inc`/`observe` given labels, a cost paid per
 * request on the admission path. Bounded like the label sets they mirror.
 */
export function createApiMetrics(
  registry: client.Registry,
  tenantRegistry: client.Registry = new client.Registry(),
) {
  const registers = [registry];
  const tenantRegisters = [tenantRegistry];
  const m = {
    registry,
    tenantRegistry,
    httpRequests: new client.Counter({
      name: "poimen_http_requests_total",
      help: "HTTP requests by method, route, status and caller kind (tenant, service, none)",
      labelNames: ["method", "route", "status", "caller"] as const,
      registers,
    }),
    httpDuration: new client.Histogram({
      name: "poimen_http_request_duration_seconds",
      help: "HTTP request duration",
      labelNames: ["method", "route"] as const,
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers,
    }),
    admissions: new client.Counter({
      name: "poimen_admissions_total",
      help: "Admissions by outcome: created, deduplicated, debounced, rejected",
      labelNames: ["outcome"] as const,
      registers,
    }),
    admissionDuration: new client.Histogram({
      name: "poimen_admission_duration_seconds",
      help: "Time in the admission kernel, by outcome",
      labelNames: ["outcome"] as const,
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
      registers,
    }),
    replayBodyMismatch: new client.Counter({
      name: "poimen_admission_replay_body_mismatch_total",
      help: "Replays of a dispatch key whose body differed from the first request's",
      registers,
    }),
    admissionCalls: new client.Counter({
      name: "poimen_admission_calls_total",
      help: "Calls of the admission kernel by entry point (http, or schedule: the schedule tick)",
      labelNames: ["entry"] as const,
      registers,
    }),
    admissionBatch: new client.Histogram({
      name: "poimen_admission_batch_size",
      help: "Admissions coalesced into one database statement (group commit)",
      buckets: [1, 2, 4, 8, 16, 32, 64, 128],
      registers,
    }),
    cancels: new client.Counter({
      name: "poimen_run_cancels_total",
      help:
        "Cancels that changed a run, by what it became: cancelled (it was queued) or running (cancel requested of its worker)",
      labelNames: ["status"] as const,
      registers,
    }),
    signals: new client.Counter({
      name: "poimen_run_signals_total",
      help:
        "Signals sent to runs (POST /v1/runs/{id}/signals), by outcome: created, replayed (its signal_id was seen), woke (created, and it woke its waiting run), refused (the run is final)",
      labelNames: ["outcome"] as const,
      registers,
    }),
    quotaRefusals: new client.Counter({
      name: "poimen_admission_quota_refusals_total",
      help: "Admissions refused by a tenant quota (429), by tenant and reason: queue-full, " +
        "rate-limited",
      labelNames: ["tenant", "reason"] as const,
      registers: tenantRegisters,
    }),
    authFailures: new client.Counter({
      name: "poimen_auth_failures_total",
      help: "Requests refused by authentication or tenant checks, by reason",
      labelNames: ["reason"] as const,
      registers,
    }),
  };
  const requestChildren = new Map<string, {
    count: client.Counter.Internal;
    duration: client.Histogram.Internal<"method" | "route">;
  }>();
  const admissionChildren = new Map<string, {
    count: client.Counter.Internal;
    duration: client.Histogram.Internal<"outcome">;
  }>();
  return {
    ...m,
    /**
     * Every series, tenant-free and per tenant, read at each scrape: what the
     * metrics listener serves (never the API port).
     */
    everySeries: {
      contentType: registry.contentType,
      metrics: async () => (await registry.metrics()) + (await tenantRegistry.metrics()),
    } satisfies MetricsSource,
    /** One admission refused by a tenant quota. */
    quotaRefused(tenant: string, reason: QuotaRefusal): void {
      m.quotaRefusals.inc({ tenant, reason });
    },
    /**
     * `poimen_tenant_queued_runs` and `poimen_tenant_max_queued`: each
     * tenant's quota use as the gate sees it (read at scrape time; only
     * tenants with a quota, so the label set is as small as the quota table).
     */
    watchQuotas(view: () => QuotaView[]): void {
      new client.Gauge({
        name: "poimen_tenant_queued_runs",
        help: "A tenant's queued runs as this API's quota gate counts them (at most its " +
          "max_queued, plus this process's admissions since the count); tenants with a " +
          "max_queued that admitted lately",
        labelNames: ["tenant"] as const,
        registers: tenantRegisters,
        collect() {
          this.reset();
          for (const q of view()) {
            if (q.queued !== undefined) this.set({ tenant: q.tenantId }, q.queued);
          }
        },
      });
      new client.Gauge({
        name: "poimen_tenant_max_queued",
        help: "A tenant's max_queued as this API's quota gate last read it",
        labelNames: ["tenant"] as const,
        registers: tenantRegisters,
        collect() {
          this.reset();
          for (const q of view()) {
            if (q.maxQueued !== null) this.set({ tenant: q.tenantId }, q.maxQueued);
          }
        },
      });
    },
    /** Exports `budget`'s bytes held and requests waiting; returns it. */
    /** `poimen_run_watchers`: waits and event streams held now (`watchers` is read at scrape time). */
    watchRunWatchers(watchers: () => number): void {
      new client.Gauge({
        name: "poimen_run_watchers",
        help: "Waits (Prefer: wait) and event streams held now, of RUN_WATCHERS_MAX",
        registers,
        collect() {
          this.set(watchers());
        },
      });
    },
    /**
     * `poimen_run_stream_buffered_bytes`, `poimen_run_stream_events_total`,
     * `poimen_run_streams_ended_total{reason}`: what event streams hold and
     * did (read from `stats` at scrape time; `reason` is a fixed set).
     */
    watchRunStreams(stats: StreamStats): void {
      new client.Gauge({
        name: "poimen_run_stream_buffered_bytes",
        help: "Bytes event streams have queued that their readers have not taken yet",
        registers,
        collect() {
          this.set(stats.bufferedBytes);
        },
      });
      new client.Counter({
        name: "poimen_run_stream_events_total",
        help: "Events written to event streams",
        registers,
        collect() {
          this.reset();
          this.inc(stats.eventsSent);
        },
      });
      new client.Counter({
        name: "poimen_run_streams_ended_total",
        help: "Event streams ended, by why: final (the run's last event), lifetime " +
          "(RUN_STREAM_MAX_MS), stalled (RUN_STREAM_STALL_MS), gone (the client), stopped, failed",
        labelNames: ["reason"] as const,
        registers,
        collect() {
          this.reset();
          for (const [reason, n] of Object.entries(stats.ended)) this.inc({ reason }, n);
        },
      });
    },
    watchBodyBudget(budget: BodyBudget): BodyBudget {
      new client.Gauge({
        name: "poimen_request_body_budget_bytes_held",
        help: "Bytes of request bodies held now, of BODY_BUDGET_BYTES",
        registers,
        collect() {
          this.set(budget.total - budget.free);
        },
      });
      new client.Gauge({
        name: "poimen_request_body_budget_waiting",
        help: "Requests waiting for their share of BODY_BUDGET_BYTES",
        registers,
        collect() {
          this.set(budget.waiting);
        },
      });
      return budget;
    },
    /** One HTTP request answered: counted and timed. */
    observeRequest(
      requestMethod: string,
      route: string,
      status: number,
      caller: string,
      seconds: number,
    ) {
      const method = methodLabel(requestMethod);
      const key = `${method} ${route} ${status} ${caller}`;
      let c = requestChildren.get(key);
      if (!c) {
        if (requestChildren.size >= 1000) requestChildren.clear();
        c = {
          count: m.httpRequests.labels({ method, route, status, caller }),
          duration: m.httpDuration.labels({ method, route }),
        };
        requestChildren.set(key, c);
      }
      c.count.inc();
      c.duration.observe(seconds);
    },
    /** One admission answered (created, deduplicated, debounced or rejected): counted and timed. */
    observeAdmission(
      outcome: "created" | "deduplicated" | "debounced" | "rejected",
      seconds: number,
    ) {
      let c = admissionChildren.get(outcome);
      if (!c) {
        c = {
          count: m.admissions.labels({ outcome }),
          duration: m.admissionDuration.labels({ outcome }),
        };
        admissionChildren.set(outcome, c);
      }
      c.count.inc();
      c.duration.observe(seconds);
    },
  };
}
