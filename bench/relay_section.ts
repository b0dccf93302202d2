/**
 * The relay section (needs the Kafka broker: `deno task kafka start`): the
 * inbox relay's drain rate on pre-published dispatch messages, then
 * publish→run and publish→event latency at a fixed 1,000 messages/s, with
 * the API and the outbox running as in production.
 */
import type { Sql } from "../db/pool.ts";
import { insertTenant } from "../db/auth.ts";
import { freePort, PoimenProcess } from "../dev/processes.ts";
import { brokerAddress, brokerAnswers } from "../dev/kafka.ts";
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { createProducer } from "../kafka/producer.ts";
import { createConsumer } from "../kafka/consumer.ts";
import { dispatchTopic, eventsTopic } from "../contracts/topics.ts";
import { delay, SECOND } from "../core/time.ts";
import { type BenchContext, check, log, q } from "./run_context.ts";
import { countWhere, createDb, tenantToken, waitHttp } from "./scenario_support.ts";
import { relayHttpClients } from "./relay_http_clients.ts";

/** The relay section; skipped with a note when no broker answers. */
export async function relaySection(ctx: BenchContext, admin: Sql): Promise<void> {
  const broker = brokerAddress();
  if (!(await brokerAnswers(broker))) {
    ctx.notes.push(
      `relay: skipped, no Kafka broker at ${broker} (start one with \`deno task kafka start\`).`,
    );
    return;
  }
  const { url, sql } = await createDb(ctx, admin, `poimen_bench_${ctx.stamp}_r`);
  const tenant = `bench-${ctx.stamp}`;
  await insertTenant(sql, tenant);
  const serviceToken = await tenantToken(sql, tenant, "service");
  const kafka = { brokers: [broker], clientId: "poimen-bench" };
  const adminK = createAdmin(kafka);
  await ensureTenantTopics(adminK, tenant, {
    partitions: 3,
    replicationFactor: 1,
    retentionMs: 3_600_000,
  });
  await adminK.close();
  const producer = createProducer(kafka);
  const port = freePort();
  const env = { DATABASE_URL: url, KAFKA_BROKERS: broker, LOG_LEVEL: "error" };
  const api = new PoimenProcess("api", { ...env, PORT: String(port), HOST: "127.0.0.1" });
  const outbox = new PoimenProcess("outbox", env);
  const startRelay = () =>
    new PoimenProcess("relay", {
      KAFKA_BROKERS: broker,
      LOG_LEVEL: "error",
      API_URL: `http://127.0.0.1:${port}`,
      RELAY_TOKEN: serviceToken,
      RELAY_GROUP_ID: `bench-${ctx.stamp}`,
      RELAY_TENANT_PATTERN: tenant, // only [a-z0-9-]: matches itself
      RELAY_TOPIC_REFRESH_MS: "500",
    });
  const msg = (key: string) => ({
    topic: dispatchTopic(tenant),
    key: `${tenant}/${key}`,
    value: JSON.stringify({ workflow_ref: "echo", input: { n: 1 }, dispatch_key: key }),
  });
  const runCount = async (prefix: string) => (await countWhere(sql, "runs", prefix));
  let relayProc: PoimenProcess | undefined;
  try {
    await waitHttp(`http://127.0.0.1:${port}/readyz`, "api");
    // Drain: messages published first, then the relay started on them.
    const drain = `drain-${ctx.stamp}`;
    for (let i = 0; i < ctx.cfg.relayDrain; i += 500) {
      await producer.send(
        Array.from(
          { length: Math.min(500, ctx.cfg.relayDrain - i) },
          (_, j) => msg(`${drain}-${i + j}`),
        ),
      );
    }
    relayProc = startRelay();
    const drained = await ctx.stats("relay").during(relayProc.pid, async () => {
      const deadline = Date.now() + 600 * SECOND;
      while ((await runCount(drain)).n < ctx.cfg.relayDrain) {
        if (relayProc!.exited || Date.now() > deadline) {
          throw new Error(`relay stalled:\n${relayProc!.logs().join("\n")}`);
        }
        await delay(100);
      }
      const [t] = await sql<{ s: number }[]>`
        select extract(epoch from max(created_at) - min(created_at))::float8 as s
          from runs where tenant_id = ${tenant} and dispatch_key like ${drain + "-%"}`;
      return t.s;
    });
    const dc = await runCount(drain);
    check(
      dc.n === ctx.cfg.relayDrain && dc.d === ctx.cfg.relayDrain,
      `relay drain: ${dc.n} runs for ${ctx.cfg.relayDrain} messages`,
    );
    ctx.figures.push({
      group: "relay",
      scenario: "relay drain, pre-published dispatch messages → runs",
      conns: 0,
      round: 1,
      rate: ctx.cfg.relayDrain / drained.value,
      p50: 0,
      p99: 0,
      cores: drained.cores,
    });
    log(`relay drain: ${(ctx.cfg.relayDrain / drained.value).toFixed(0)}/s`);

    // Latency at a fixed 1,000 messages/s: 10 messages every 10 ms, once the
    // outbox has shipped the drain's events (it competes for the same cores).
    const backlogDeadline = Date.now() + 120 * SECOND;
    while (
      (await sql<{ n: number }[]>`
        select count(*)::int as n from work_events where published_at is null`)[0].n > 0
    ) {
      if (Date.now() > backlogDeadline) {
        throw new Error("the outbox did not ship the drain's events");
      }
      await delay(200);
    }
    const live = `live-${ctx.stamp}`;
    const sent = new Map<string, number>();
    const eventAt = new Map<string, number>();
    const consumer = createConsumer({
      ...kafka,
      groupId: `bench-events-${ctx.stamp}`,
      topics: [eventsTopic(tenant)],
      startFrom: "latest",
      maxWaitMs: 10,
    });
    const consuming = (async () => {
      for await (const m of consumer) {
        const v = JSON.parse(new TextDecoder().decode(m.value));
        if (v.type === "run.admitted" && typeof v.dispatch_key === "string") {
          if (!eventAt.has(v.dispatch_key)) eventAt.set(v.dispatch_key, Date.now());
        }
      }
    })();
    await delay(3 * SECOND); // the consumer joins its group before the first publish
    const total = ctx.cfg.relaySecs * 1000;
    const t0 = performance.now();
    const sends: Promise<unknown>[] = [];
    for (let i = 0; i < total; i += 10) {
      const due = t0 + i;
      const wait = due - performance.now();
      if (wait > 0) await delay(wait);
      const batch = Array.from({ length: 10 }, (_, j) => `${live}-${i + j}`);
      const at = Date.now();
      for (const k of batch) sent.set(k, at);
      sends.push(producer.send(batch.map(msg)));
    }
    await Promise.all(sends);
    const publishSecs = (performance.now() - t0) / 1000;
    const deadline = Date.now() + 120 * SECOND;
    while ((await runCount(live)).n < total || eventAt.size < total) {
      if (Date.now() > deadline) {
        throw new Error(`live: ${(await runCount(live)).n} runs, ${eventAt.size} events`);
      }
      await delay(200);
    }
    await consumer.close();
    await consuming.catch(() => {});
    const lc = await runCount(live);
    check(lc.n === total && lc.d === total, `relay live: ${lc.n} runs for ${total} messages`);
    const rows = await sql<{ k: string; at: number }[]>`
      select dispatch_key as k, extract(epoch from created_at)::float8 * 1000 as at
        from runs where tenant_id = ${tenant} and dispatch_key like ${live + "-%"}`;
    const toRun = rows.map((r) => r.at - sent.get(r.k)!).sort((a, b) => a - b);
    const toEvent = [...eventAt].map(([k, at]) => at - sent.get(k)!).sort((a, b) => a - b);
    ctx.figures.push({
      group: "relay",
      scenario: `publish → run (created_at), ${(total / publishSecs).toFixed(0)} msg/s`,
      conns: 0,
      round: 1,
      rate: total / publishSecs,
      p50: q(toRun, 0.5),
      p99: q(toRun, 0.99),
    });
    ctx.figures.push({
      group: "relay",
      scenario: `publish → run.admitted consumed from .events, ${
        (total / publishSecs).toFixed(0)
      } msg/s`,
      conns: 0,
      round: 1,
      rate: total / publishSecs,
      p50: q(toEvent, 0.5),
      p99: q(toEvent, 0.99),
    });
    log(
      `relay live: run p99 ${q(toRun, 0.99).toFixed(0)} ms, event p99 ${
        q(toEvent, 0.99).toFixed(0)
      } ms`,
    );
    // Last, with the relay stopped so that it takes no CPU beside them: the
    // clients alone (their admissions' events are left to the outbox).
    ctx.stats("relay").sampleRss(relayProc.pid);
    await relayProc.stop();
    relayProc = undefined;
    await relayHttpClients(
      ctx,
      sql,
      `http://127.0.0.1:${port}`,
      serviceToken,
      tenant,
      Math.round(ctx.cfg.relayDrain / 2),
      ctx.cfg.rounds,
    );
  } finally {
    await producer.close().catch(() => {});
    if (relayProc) {
      ctx.stats("relay").sampleRss(relayProc.pid);
      await relayProc.stop();
    }
    ctx.stats("outbox").sampleRss(outbox.pid);
    ctx.stats("api").sampleRss(api.pid);
    await outbox.stop();
    await api.stop();
    await sql.end();
  }
}
