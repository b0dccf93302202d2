/**
 * The outbox's Kafka side: declares each tenant's events topic once, sends
 * records with a deadline, and replaces the producer after a failed send.
 */
import { PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { delay, within } from "../core/time.ts";
import type { PendingEvent } from "../db/outbox.ts";
import type { KafkaAdmin, TopicSpec } from "../kafka/admin.ts";
import type { KafkaProducer, ProduceMessage } from "../kafka/producer.ts";
import { type TenantTopicOptions, tenantTopicSpecs } from "../kafka/topics.ts";

/** The Kafka side of the publisher: a producer factory (a failed producer is replaced) and an admin. */
export interface OutboxKafka {
  createProducer(): KafkaProducer;
  admin: KafkaAdmin;
}

/** Options of `KafkaSender`. */
export interface KafkaSenderOptions {
  /** Longest one send may take before it is abandoned (and the producer replaced). */
  sendTimeoutMs: number;
  topics: TenantTopicOptions;
  log: Logger;
  /** After a send the broker acknowledged: how many records and how long it took. */
  onPublished?(count: number, seconds: number): void;
}

/** Sends the outbox's records to Kafka; see the module comment. */
export class KafkaSender {
  readonly #kafka: OutboxKafka;
  readonly #opts: KafkaSenderOptions;
  readonly #ensured = new Set<string>();
  readonly #invalidTenants = new Set<string>();
  #producer: KafkaProducer | undefined;

  constructor(kafka: OutboxKafka, opts: KafkaSenderOptions) {
    this.#kafka = kafka;
    this.#opts = opts;
  }

  /** Declares the events topic of every tenant not seen yet; returns the events that may be sent. */
  async ensureTopics<E extends PendingEvent>(events: E[]): Promise<E[]> {
    const tenants = new Set(events.map((e) => e.tenant_id));
    for (const tenant of tenants) {
      if (this.#ensured.has(tenant) || this.#invalidTenants.has(tenant)) continue;
      let topic: TopicSpec;
      try {
        // The events topic only: dispatch topics are the publishers' to declare.
        topic = tenantTopicSpecs(tenant, this.#opts.topics)[0];
      } catch (error) {
        // Cannot be a topic name: leave its rows pending rather than fail every batch.
        this.#invalidTenants.add(tenant);
        this.#opts.log.error("tenant id is not a valid topic name; its events stay pending", {
          tenant,
          error,
        });
        continue;
      }
      await this.#kafka.admin.createTopics([topic]);
      this.#ensured.add(tenant);
    }
    if (this.#invalidTenants.size === 0) return events;
    return events.filter((e) => !this.#invalidTenants.has(e.tenant_id));
  }

  /** Sends `messages` and resolves once the broker acknowledged all of them. */
  async send(messages: ProduceMessage[]): Promise<void> {
    const producer = this.#producer ??= this.#kafka.createProducer();
    const started = performance.now();
    const timeout = new AbortController();
    try {
      await Promise.race([
        producer.send(messages),
        delay(this.#opts.sendTimeoutMs, timeout.signal).then(() => {
          if (!timeout.signal.aborted) {
            throw new PoimenError(
              "kafka-unavailable",
              `publish not acknowledged within ${this.#opts.sendTimeoutMs} ms`,
            );
          }
        }),
      ]);
    } catch (error) {
      // After a failed or abandoned send the producer's sequence state is
      // unknown; a fresh producer (new producer id) starts clean.
      if (this.#producer === producer) await this.dropProducer();
      // A topic deleted behind our back fails every send: declare again
      // (idempotent, one request per tenant) on the next try.
      this.#ensured.clear();
      throw error;
    } finally {
      timeout.abort();
    }
    this.#opts.onPublished?.(messages.length, (performance.now() - started) / 1000);
  }

  /** Closes the producer (ending a pending send); the next send opens a new one. */
  async dropProducer(): Promise<void> {
    const producer = this.#producer;
    this.#producer = undefined;
    if (!producer) return;
    // Closing needs no broker, but don't let a wedged client hold up a stop.
    await within(producer.close().catch(() => {}), 5000);
  }

  /** Closes the producer and the admin. */
  async close(): Promise<void> {
    await this.dropProducer();
    await this.#kafka.admin.close().catch(() => {});
  }
}
