/**
 * The narrow view of a Kafka consumer group client that the consumer's
 * supervisor (consumer_supervisor.ts) works over: join and fetch a stream,
 * keep the membership across a stream restart, find the group coordinator,
 * close. `platformatic_group_client.ts` adapts @platformatic/kafka to it; a
 * unit test gives the supervisor a fake that hangs where the library was seen
 * to hang.
 */
import type { ConsumedMessage } from "./consumer.ts";

/** A broker's address. */
export interface BrokerAddress {
  host: string;
  port: number;
}

/** What the group told this member when it joined. */
export interface GroupJoin {
  /** Undefined when the library did not say (then nothing can be committed as it). */
  generationId: number | undefined;
  memberId: string | undefined;
  /** The partitions assigned to this member, per topic. */
  assignments: { topic: string; partitions: number[] }[];
}

/** What a client tells the supervisor about its group membership. */
export interface GroupClientEvents {
  /** Each time the client joined the group (each join is a rebalance). */
  joined(join: GroupJoin): void;
  /** The client left the group: it owns nothing any more. */
  left(): void;
}

/** How one stream joins and fetches. */
export interface ConsumeSettings {
  topics: string[];
  /** Where a partition without a committed offset starts. */
  startFrom: "earliest" | "latest";
  maxWaitMs: number;
  maxFetchBytes: number;
  sessionTimeoutMs: number;
  rebalanceTimeoutMs: number;
  heartbeatIntervalMs: number;
}

/**
 * A fetch stream from the committed offsets of the partitions assigned to
 * this member. Its events: "data" per message, "fetch" per completed fetch
 * (with or without messages), "error" once it failed, "close" once it ended.
 */
export interface FetchStream {
  readonly destroyed: boolean;
  isPaused(): boolean;
  pause(): void;
  resume(): void;
  /** Asks it to end after the fetch under way; resolves once it ended. */
  close(): Promise<void>;
  /** Ends it at once. */
  destroy(): void;
  on(event: "data", listener: (message: ConsumedMessage) => void): void;
  on(event: "fetch", listener: () => void): void;
  once(event: "error", listener: (error: Error) => void): void;
  once(event: "close", listener: () => void): void;
}

/** A consumer group member's client. */
export interface GroupClient {
  /**
   * Joins the group when it must (first use, or topics it was not consuming
   * yet) and starts a fetch stream of `settings.topics`.
   */
  consume(settings: ConsumeSettings): Promise<FetchStream>;
  /**
   * Keeps the membership across the end of the current stream: the next
   * `consume` of the same topics fetches again under the same membership and
   * assignment instead of joining the group again (which stops every member
   * of the group). A `consume` of other topics lets go of it first, and every
   * `consume` lets go of it once settled. Holding again while held is a no-op.
   */
  holdMembership(topics: string[]): void;
  /** The group coordinator's address (for commits sent on a connection of their own). */
  coordinator(topics: string[]): Promise<BrokerAddress>;
  /** Leaves the group (unless `force`) and closes the client. */
  close(force: boolean): Promise<void>;
}

/** Makes a client that reports its membership to `events`. */
export type GroupClientFactory = (events: GroupClientEvents) => GroupClient;
