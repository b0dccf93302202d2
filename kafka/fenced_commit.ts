/**
 * Commits fenced by the group generation: each attempt is sent under the
 * generation whose assignment said this member owns what it commits, so the
 * broker refuses it once the group has moved on, and a partition given to
 * another member meanwhile is never committed from here.
 */
import { ConnectionPool, offsetCommitV8 } from "@platformatic/kafka";
import { PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, delay } from "../core/time.ts";
import {
  DEFAULT_REQUEST_TIMEOUT,
  type KafkaClientOptions,
  kafkaFailure,
  RETRY_BASE,
  RETRY_CAP,
  type TopicPartitionOffset,
} from "./client.ts";
import type { Assignment, Membership } from "./assignment.ts";
import { settleWithin } from "./deadline.ts";
import { libraryTlsSasl } from "./security.ts";
import type { GroupClient } from "./group_client.ts";

/** What a `FencedCommitter` reads on each attempt. */
export interface CommitContext {
  /** The group's last assignment to this member. */
  assignment: Assignment;
  /** The client of the membership, if one is up. */
  client(): GroupClient | undefined;
  /** The topics subscribed (the metadata asked to find the coordinator). */
  topics(): readonly string[];
}

/** Options of `FencedCommitter`. */
export interface FencedCommitOptions extends KafkaClientOptions {
  groupId: string;
}

/** Sends commits as the membership that owns what they commit; see `KafkaConsumer.commit`. */
export class FencedCommitter {
  readonly #opts: FencedCommitOptions;
  readonly #log: Logger;
  readonly #context: CommitContext;
  readonly #stop: AbortSignal;
  // Commits go over their own connection, not through the client (see #commitAs).
  #pool: ConnectionPool | undefined;

  constructor(opts: FencedCommitOptions, log: Logger, context: CommitContext, stop: AbortSignal) {
    this.#opts = opts;
    this.#log = log;
    this.#context = context;
    this.#stop = stop;
  }

  /** Retries until committed (or nothing of `offsets` is owned) or stopped (then rejects). */
  async commit(offsets: TopicPartitionOffset[]): Promise<void> {
    for (let attempt = 0;; attempt++) {
      if (this.#stop.aborted) throw new Error("kafka consumer is closed");
      // Re-checked on every attempt: a retry may come after a rebalance, and
      // is sent under the generation that assigned what it commits. Before
      // the first join (or after the membership was lost) nothing is owned.
      const { assignment } = this.#context;
      const member = assignment.member;
      const client = this.#context.client();
      if (member && client) {
        const mine = offsets.filter((o) => assignment.owns(o.topic, o.partition));
        if (mine.length === 0) return;
        try {
          await this.#commitAs(client, member, mine);
          return;
        } catch (error) {
          if (this.#stop.aborted) throw error;
          this.#log.warn("kafka commit failed, retrying", { error, attempt });
        }
      }
      await delay(Math.max(50, backoffWithJitter(attempt, RETRY_BASE, RETRY_CAP)), this.#stop);
    }
  }

  /** Closes the commits' connection; no other is opened after the stop signal. */
  async close(): Promise<void> {
    await this.#pool?.close().catch(() => {});
  }

  /**
   * One OffsetCommit request as `member`, to the group's coordinator. Not the
   * library's `commit()`: in @platformatic/kafka 2.12.1, on a generation
   * error it joins the group again and sends the same offsets under the new
   * generation, whatever the new assignment says (seen in chaos runs: a
   * relay's late commit moved a partition's offset back after its new owner
   * had committed past it, and the messages in between were never read
   * again). OffsetCommit v8 needs Kafka 2.4 or later (Kafka 4 serves v2 to v9).
   */
  async #commitAs(
    client: GroupClient,
    member: Membership,
    offsets: TopicPartitionOffset[],
  ): Promise<void> {
    const requestTimeout = this.#opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT;
    const work = (async () => {
      const broker = await client.coordinator([...this.#context.topics()]);
      // close() closes the pool it finds; none is opened after it.
      if (this.#stop.aborted) throw new Error("kafka consumer is closed");
      this.#pool ??= new ConnectionPool(`${this.#opts.clientId}-commits`, {
        connectTimeout: this.#opts.connectTimeoutMs,
        requestTimeout,
        // A connection of its own: it must secure itself as the consumer's do.
        ...libraryTlsSasl(this.#opts.security),
      });
      const connection = await this.#pool.get(broker);
      const topics = new Map<string, offsetCommitV8.OffsetCommitRequestTopic>();
      for (const o of offsets) {
        let topic = topics.get(o.topic);
        if (!topic) topics.set(o.topic, topic = { name: o.topic, partitions: [] });
        topic.partitions.push({
          partitionIndex: o.partition,
          committedOffset: o.offset,
          committedLeaderEpoch: -1,
        });
      }
      await offsetCommitV8.api.async(
        connection,
        this.#opts.groupId,
        member.generationId,
        member.memberId,
        null,
        [...topics.values()],
      );
    })();
    // Each step is bounded by the request timeout; together they must be too.
    const done = await settleWithin(work, 3 * requestTimeout, this.#stop)
      .catch((error) => ({ error }));
    if (typeof done === "object" && "value" in done) return;
    // The next attempt connects afresh: a connection to a broker that went
    // away is not always noticed by the pool (@platformatic/kafka 2.12.1's
    // ConnectionPool).
    const pool = this.#pool;
    this.#pool = undefined;
    void pool?.close().catch(() => {});
    if (done === "stopped") throw new Error("kafka consumer is closed");
    throw done === "timed-out"
      ? new PoimenError("kafka-unavailable", "the commit did not finish in time")
      : kafkaFailure("kafka commit", done.error);
  }
}
