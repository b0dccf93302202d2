/**
 * `GroupClient` (group_client.ts) over the consumer of @platformatic/kafka
 * 2.12.1, with the workarounds its behaviour asks for; each is shown still
 * needed by tests/kafka_platformatic_group_client_test.ts against the real
 * broker, so an upgrade tells which can go.
 */
import { Buffer } from "node:buffer";
import {
  Consumer,
  type GroupAssignment,
  type Message,
  type MessagesStream,
  stringDeserializer,
} from "@platformatic/kafka";
import { PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { baseOptions, identityBuffer, type KafkaClientOptions } from "./client.ts";
import type { ConsumedMessage } from "./consumer.ts";
import type {
  BrokerAddress,
  ConsumeSettings,
  FetchStream,
  GroupClient,
  GroupClientEvents,
} from "./group_client.ts";

type RawMessage = Message<string, Buffer, string, string>;
type RawStream = MessagesStream<string, Buffer, string, string>;

/** The library consumer poimen builds: string keys and headers, values as bytes. */
export type LibraryConsumer = Consumer<string, Buffer, string, string>;

/** Options of `platformaticGroupClient`. */
export interface PlatformaticGroupClientOptions extends KafkaClientOptions {
  groupId: string;
}

/** A message of the library as `ConsumedMessage`. */
function toConsumed(m: RawMessage): ConsumedMessage {
  const headers: Record<string, string> = {};
  for (const [k, v] of m.headerEntries) headers[k] = v ?? "";
  return {
    topic: m.topic,
    partition: m.partition,
    offset: m.offset,
    key: m.key ?? "",
    value: m.value ?? new Uint8Array(0),
    headers,
    timestamp: Number(m.timestamp),
  };
}

/** The library consumer poimen builds: manual commits only, values as bytes. */
export function newLibraryConsumer(opts: PlatformaticGroupClientOptions): LibraryConsumer {
  return new Consumer<string, Buffer, string, string>({
    ...baseOptions(opts),
    retries: 5,
    groupId: opts.groupId,
    autocommit: false,
    deserializers: {
      key: stringDeserializer,
      value: identityBuffer,
      headerKey: stringDeserializer,
      headerValue: stringDeserializer,
    },
  });
}

/** A `GroupClient` over a new @platformatic/kafka consumer. */
export function platformaticGroupClient(
  opts: PlatformaticGroupClientOptions,
  log: Logger,
  events: GroupClientEvents,
): GroupClient {
  return new PlatformaticGroupClient(newLibraryConsumer(opts), log, events);
}

class PlatformaticGroupClient implements GroupClient {
  readonly #client: LibraryConsumer;
  // Topics tracked on the client by holdMembership (see there).
  #held: string[] | undefined;

  constructor(client: LibraryConsumer, log: Logger, events: GroupClientEvents) {
    this.#client = client;
    // Without a listener an emitted 'error' would crash the process.
    client.on("error", (error: Error) => log.warn("kafka consumer error", { error }));
    // Ours are the first listeners (the library's streams register theirs
    // when created): the assignment is known here before anything of a new
    // one is fetched.
    client.on(
      "consumer:group:join",
      (event: { generationId?: number; memberId?: string; assignments?: GroupAssignment[] }) =>
        events.joined({
          generationId: event.generationId,
          memberId: event.memberId || undefined,
          assignments: event.assignments ?? [],
        }),
    );
    client.on("consumer:group:leave", () => events.left());
    client.on(
      "consumer:heartbeat:error",
      (payload: { error: Error }) => log.debug("kafka heartbeat failed", { error: payload.error }),
    );
  }

  async consume(settings: ConsumeSettings): Promise<FetchStream> {
    const { topics } = settings;
    // Holding other topics than these would subscribe the group to them.
    const held = this.#held;
    if (held && !(held.length === topics.length && held.every((t, i) => t === topics[i]))) {
      this.#release();
    }
    try {
      const stream = await this.#client.consume({
        topics,
        mode: "committed",
        fallbackMode: settings.startFrom,
        autocommit: false,
        maxWaitTime: settings.maxWaitMs,
        maxBytes: settings.maxFetchBytes,
        sessionTimeout: settings.sessionTimeoutMs,
        // The library's default (102 s in 2.12.1) would let one member that never
        // rejoins hold every other member's join that long.
        rebalanceTimeout: settings.rebalanceTimeoutMs,
        heartbeatInterval: settings.heartbeatIntervalMs,
      }).catch((error) => {
        // @platformatic/kafka 2.12.1: a consume that failed (e.g. its join)
        // leaves its topics tracked; the next one would then see no change,
        // skip the join and fetch without being a member.
        this.#client.topics.untrackAll(...topics);
        throw error;
      });
      return new LibraryStream(stream);
    } finally {
      // The new stream tracks its own topics (or the consume failed).
      this.#release();
    }
  }

  /**
   * @platformatic/kafka 2.12.1 joins the group again when a consume tracks
   * a topic anew, and a stream's end untracks its topics: every stream
   * restart would rejoin, and a rejoin stops every member of the group (a
   * Postgres outage that pauses and resumes partitions would rebalance the
   * group each time). Kept tracked, the next consume reuses the membership
   * and its assignment, and only fetches again from the committed offsets.
   */
  holdMembership(topics: string[]): void {
    if (this.#held) return;
    this.#client.topics.trackAll(...topics);
    this.#held = [...topics];
  }

  #release(): void {
    const held = this.#held;
    this.#held = undefined;
    if (held) this.#client.topics.untrackAll(...held);
  }

  async coordinator(topics: string[]): Promise<BrokerAddress> {
    const coordinator = await this.#client.findGroupCoordinator();
    const metadata = await this.#client.metadata({ topics });
    const broker = metadata.brokers.get(coordinator);
    if (!broker) {
      throw new PoimenError(
        "kafka-unavailable",
        `the group coordinator (node ${coordinator}) is not in the metadata`,
      );
    }
    return broker;
  }

  close(force: boolean): Promise<void> {
    this.#held = undefined;
    return this.#client.close(force);
  }
}

/** The library's stream, handing out `ConsumedMessage`s. */
class LibraryStream implements FetchStream {
  readonly #stream: RawStream;

  constructor(stream: RawStream) {
    this.#stream = stream;
  }

  get destroyed(): boolean {
    return this.#stream.destroyed;
  }

  isPaused(): boolean {
    return this.#stream.isPaused();
  }

  pause(): void {
    this.#stream.pause();
  }

  resume(): void {
    this.#stream.resume();
  }

  close(): Promise<void> {
    return this.#stream.close();
  }

  destroy(): void {
    this.#stream.destroy();
  }

  on(event: "data", listener: (message: ConsumedMessage) => void): void;
  on(event: "fetch", listener: () => void): void;
  on(event: "data" | "fetch", listener: ((message: ConsumedMessage) => void) | (() => void)) {
    if (event === "fetch") this.#stream.on("fetch", listener as () => void);
    else {
      const deliver = listener as (message: ConsumedMessage) => void;
      this.#stream.on("data", (m: RawMessage) => deliver(toConsumed(m)));
    }
  }

  once(event: "error", listener: (error: Error) => void): void;
  once(event: "close", listener: () => void): void;
  once(event: "error" | "close", listener: ((error: Error) => void) | (() => void)) {
    if (event === "error") this.#stream.once("error", listener as (error: Error) => void);
    else this.#stream.once("close", listener as () => void);
  }
}
