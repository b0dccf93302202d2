/**
 * The small HTTP server each process (worker, outbox, relay and the API)
 * exposes on its metrics port: `/metrics` (Prometheus text of its own
 * registry), `/healthz` (alive) and `/readyz` (its dependencies answer; see
 * core/health.ts). The API serves the same paths on its own port too, but
 * there its `/metrics` has only the series that name no tenant. No label
 * value here comes from a request.
 */
import type client from "prom-client";
import type { Logger } from "./log.ts";
import { checkReadiness, type Probe } from "./health.ts";
import type { Part } from "./process_harness.ts";

/** What `/metrics` serves: a prom-client registry, or several read as one. */
export type MetricsSource = Pick<client.Registry, "metrics" | "contentType">;

export interface MetricsServer {
  server: Deno.HttpServer;
  /** The port it listens on (useful when asked for port 0). */
  port: number;
}

export interface MetricsServerOptions {
  /** Adds fields to the `/healthz` JSON. */
  health?: () => Record<string, unknown>;
  /** The dependencies `/readyz` probes, by name. */
  probes?: Record<string, Probe>;
}

/**
 * Serves `/metrics`, `/healthz` and `/readyz` on `hostname:port` (port 0: a
 * free one); resolves once listening.
 */
async function serveMetrics(
  registry: MetricsSource,
  hostname: string,
  port: number,
  log: Logger,
  options: MetricsServerOptions = {},
): Promise<MetricsServer> {
  const { health = () => ({}), probes = {} } = options;
  const listening = Promise.withResolvers<number>();
  const server = Deno.serve({
    hostname,
    port,
    onListen: (addr) => {
      log.info("metrics listening", { url: `http://${addr.hostname}:${addr.port}/metrics` });
      listening.resolve(addr.port);
    },
  }, async (req) => {
    const path = new URL(req.url).pathname;
    if (path === "/metrics") {
      return new Response(await registry.metrics(), {
        headers: { "content-type": registry.contentType },
      });
    }
    if (path === "/healthz") return Response.json({ status: "ok", ...health() });
    if (path === "/readyz") {
      const { ready, checks } = await checkReadiness(probes, log);
      return Response.json({ status: ready ? "ready" : "not-ready", checks }, {
        status: ready ? 200 : 503,
      });
    }
    return new Response("not found\n", { status: 404 });
  });
  return { server, port: await listening.promise };
}

/**
 * `serveMetrics` as a part of a process (core/process_harness.ts) called
 * "metrics server": it serves on start and finishes the requests in flight on stop.
 */
export function metricsPart(
  registry: MetricsSource,
  hostname: string,
  port: number,
  log: Logger,
  options: MetricsServerOptions = {},
): Part {
  let server: Deno.HttpServer | undefined;
  return {
    name: "metrics server",
    async start() {
      server = (await serveMetrics(registry, hostname, port, log, options)).server;
    },
    stop: async () => await server?.shutdown(),
  };
}
