/**
 * The small HTTP server each background process (worker, outbox, relay)
 * exposes: `/metrics` (Prometheus text of its own registry) and `/healthz`.
 * The API serves the same paths from its hono app instead.
 */
import type client from "prom-client";
import type { Logger } from "./log.ts";

export interface MetricsServer {
  server: Deno.HttpServer;
  /** The port it listens on (useful when asked for port 0). */
  port: number;
}

/**
 * Serves `/metrics` and `/healthz` on `hostname:port` (port 0: a free one);
 * resolves once listening. `health` adds fields to the `/healthz` JSON.
 */
export async function serveMetrics(
  registry: client.Registry,
  hostname: string,
  port: number,
  log: Logger,
  health: () => Record<string, unknown> = () => ({}),
): Promise<MetricsServer> {
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
    return new Response("not found\n", { status: 404 });
  });
  return { server, port: await listening.promise };
}
