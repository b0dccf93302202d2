/**
 * Writes a message's dead letter (see dead_letter.ts for what it holds) and
 * retries until the broker acknowledged it: the message counts as done only
 * then. Only the relay's hard stop gives up on it.
 */
import type { ErrorCode } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, delay } from "../core/time.ts";
import type { ConsumedMessage } from "../kafka/consumer.ts";
import type { KafkaProducer } from "../kafka/producer.ts";
import { deadLetter, type Failure } from "./dead_letter.ts";
import type { RelayMetrics } from "./metrics.ts";

const STOP = Symbol("stop");

/**
 * `work`, or STOP once `signal` aborts, whichever comes first. The listener
 * goes when `work` settles: one left per call would keep a closure per dead
 * letter on the hard-stop signal for the life of the process.
 */
async function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T | typeof STOP> {
  if (signal.aborted) return STOP;
  const stopped = Promise.withResolvers<typeof STOP>();
  const onAbort = () => stopped.resolve(STOP);
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    return await Promise.race([work, stopped.promise]);
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}

/** What the writer talks to. */
export interface DeadLetterWriterDeps {
  producer: Pick<KafkaProducer, "send">;
  metrics: Pick<RelayMetrics, "messages" | "retries">;
  log: Logger;
}

/** Dead-letters messages, each until acknowledged or the hard stop. */
export class DeadLetterWriter {
  readonly #deps: DeadLetterWriterDeps;
  readonly #backoff: { baseMs: number; capMs: number };
  readonly #hardStop: AbortSignal;

  /** `hardStop` abandons every write (the message stays uncommitted). */
  constructor(
    backoff: { baseMs: number; capMs: number },
    deps: DeadLetterWriterDeps,
    hardStop: AbortSignal,
  ) {
    this.#deps = deps;
    this.#backoff = backoff;
    this.#hardStop = hardStop;
  }

  /** Resolves true once the broker acknowledged the dead letter, false when the hard stop came first. */
  async write(tenant: string, m: ConsumedMessage, why: Failure): Promise<boolean> {
    const { producer, metrics, log } = this.#deps;
    const letter = deadLetter(tenant, m, why);
    const where = { tenant, topic: m.topic, partition: m.partition, offset: String(m.offset) };
    for (let attempt = 0;; attempt++) {
      if (this.#hardStop.aborted) return false;
      try {
        const sent = await untilAborted(producer.send([letter]), this.#hardStop);
        if (sent === STOP) return false;
        metrics.messages.inc({ outcome: "dead_lettered" });
        log.warn("dead-lettered", {
          ...where,
          reason: why.reason,
          status: why.status,
          detail: why.detail,
          attempts: why.attempts,
          dlq: letter.topic,
          dlq_offset: String(sent[0]?.offset),
        });
        return true;
      } catch (error) {
        metrics.retries.inc({ reason: "kafka-unavailable" satisfies ErrorCode });
        log.warn("dead letter write failed, retrying", { ...where, error, attempt });
        await delay(
          backoffWithJitter(attempt, this.#backoff.baseMs, this.#backoff.capMs),
          this.#hardStop,
        );
      }
    }
  }
}
