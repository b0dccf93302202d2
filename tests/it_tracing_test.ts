/**
 * Traces end to end, with Deno's built-in OpenTelemetry exporting OTLP
 * (http/json) to a receiver in this test: one dispatch message published
 * with a `traceparent` yields one trace with spans from the relay, the API
 * and the worker, the run stores that trace, and its events on
 * `poimen.<tenant>.events` carry it as their `traceparent` header.
 */
import assert from "node:assert/strict";
import { startBroker } from "../dev/kafka.ts";
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { DispatchPublisher } from "../client/dispatch.ts";
import { SECOND } from "../core/time.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, freePort, PoimenProcess, runCommand } from "./support/processes.ts";
import { BROKER, consume, KAFKA_TEST } from "./support/kafka.ts";

await startBroker();

interface ReceivedSpan {
  service: string;
  traceId: string;
  name: string;
}

/** An OTLP/HTTP receiver (JSON): keeps every span it is sent. */
function otlpReceiver() {
  const spans: ReceivedSpan[] = [];
  const port = freePort();
  const server = Deno.serve({ port, hostname: "127.0.0.1", onListen() {} }, async (req) => {
    const path = new URL(req.url).pathname;
    const body = await req.text();
    if (path === "/v1/traces") {
      const doc = JSON.parse(body) as {
        resourceSpans?: {
          resource?: { attributes?: { key: string; value: { stringValue?: string } }[] };
          scopeSpans?: { spans?: { traceId: string; name: string }[] }[];
        }[];
      };
      for (const rs of doc.resourceSpans ?? []) {
        const service = rs.resource?.attributes?.find((a) => a.key === "service.name")?.value
          .stringValue ?? "";
        for (const ss of rs.scopeSpans ?? []) {
          for (const s of ss.spans ?? []) spans.push({ service, traceId: s.traceId, name: s.name });
        }
      }
    }
    return new Response("{}", { headers: { "content-type": "application/json" } });
  });
  return { url: `http://127.0.0.1:${port}`, spans, stop: () => server.shutdown() };
}

Deno.test({
  name:
    "tracing: one dispatch message yields one trace spanning relay, API and worker, and its events carry it",
  ...KAFKA_TEST,
  async fn() {
    const receiver = otlpReceiver();
    const db = await freshDatabase();
    const tenant = `trace-${crypto.randomUUID().slice(0, 8)}`;
    const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
    const otel = (service: string) => ({
      OTEL_DENO: "true",
      OTEL_SERVICE_NAME: service,
      OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
      OTEL_DENO_CONSOLE: "ignore",
      LOG_LEVEL: "warn",
    });
    const processes: PoimenProcess[] = [];
    const publisher = new DispatchPublisher({ brokers: [BROKER], clientId: "poimen-test" });
    try {
      await ensureTenantTopics(admin, tenant, {
        partitions: 1,
        replicationFactor: 1,
        retentionMs: 3_600_000,
      });
      assert.equal((await runCommand("token", [tenant], { DATABASE_URL: db.url })).code, 0);
      const relayToken = await runCommand("token", ["--service", "relay"], {
        DATABASE_URL: db.url,
        LOG_LEVEL: "warn",
      });
      assert.equal(relayToken.code, 0, relayToken.stderr);
      const api = new ApiProcess({ DATABASE_URL: db.url, ...otel("poimen-api") });
      processes.push(api);
      await api.ready();
      processes.push(
        new PoimenProcess("relay", {
          ...otel("poimen-relay"),
          KAFKA_BROKERS: BROKER,
          API_URL: api.url,
          RELAY_TOKEN: relayToken.stdout.trim(),
          RELAY_GROUP_ID: `poimen-test-relay-${tenant}`,
          RELAY_TENANT_PATTERN: tenant,
          RELAY_TOPIC_REFRESH_MS: "500",
        }),
        new PoimenProcess("worker", {
          ...otel("poimen-worker"),
          DATABASE_URL: db.url,
          WORKER_POLL_MS: "50",
        }),
        new PoimenProcess("outbox", {
          DATABASE_URL: db.url,
          KAFKA_BROKERS: BROKER,
          LOG_LEVEL: "warn",
        }),
      );

      const traceId = crypto.randomUUID().replaceAll("-", "");
      const traceparent = `00-${traceId}-${"ab".repeat(8)}-01`;
      const receipt = await publisher.publish(
        tenant,
        { workflow_ref: "echo", input: { traced: true }, dispatch_key: "t-1" },
        { traceparent },
      );
      assert.equal(receipt.traceparent, traceparent);

      const [run] = await waitFor("the run succeeded", async () => {
        const rows = await db.sql<{ run_id: string; status: string; traceparent: string }[]>`
          select run_id, status, traceparent from runs
           where tenant_id = ${tenant} and dispatch_key = 't-1'`;
        return rows[0]?.status === "succeeded" ? rows : undefined;
      }, 60 * SECOND);
      assert.equal(run.traceparent.split("-")[1], traceId, "the run stores the message's trace");

      const services = await waitFor("spans of the trace from relay, api and worker", () => {
        const seen = new Set(
          receiver.spans.filter((s) => s.traceId === traceId).map((s) => s.service),
        );
        return ["poimen-relay", "poimen-api", "poimen-worker"].every((s) => seen.has(s))
          ? seen
          : undefined;
      }, 60 * SECOND);
      assert.ok(services.size >= 3);
      assert.ok(
        receiver.spans.some((s) => s.traceId === traceId && s.name === "poimen run echo@1"),
        "the attempt's span",
      );

      const { got, consumer } = consume(`poimen.${tenant}.events`);
      try {
        await waitFor("the run's three events", () => got.length >= 3, 60 * SECOND);
      } finally {
        await consumer.close();
      }
      for (const e of got) {
        assert.equal(e.headers.traceparent?.split("-")[1], traceId, "an event's traceparent");
      }
    } finally {
      await publisher.close();
      for (const p of processes) await p.stop();
      await admin.close();
      await receiver.stop();
      await db.drop();
    }
  },
});
