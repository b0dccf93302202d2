/**
 * A fake of the consumer's narrow client interface (kafka/group_client.ts)
 * for unit tests of the supervisor: each client, stream and topic listing
 * does what the test scripts, including hang the way the library was seen to.
 */
import type { ConsumedMessage } from "../../kafka/consumer.ts";
import type {
  BrokerAddress,
  ConsumeSettings,
  FetchStream,
  GroupClient,
  GroupClientEvents,
} from "../../kafka/group_client.ts";
import type { TopicLister } from "../../kafka/topic_selection.ts";

/** A promise that never settles: a library call that lost its callback. */
export function never<T>(): Promise<T> {
  return new Promise<T>(() => {});
}

/** A message of `topic`/`partition` at `offset`, valued `value`. */
export function message(
  topic: string,
  partition: number,
  offset: bigint,
  value = "x",
): ConsumedMessage {
  return {
    topic,
    partition,
    offset,
    key: "",
    value: new TextEncoder().encode(value),
    headers: {},
    timestamp: 0,
  };
}

/** A scripted fetch stream. */
export class FakeStream implements FetchStream {
  destroyed = false;
  paused = false;
  /** How many times close() was called. */
  closes = 0;
  /** When true, close() never resolves (the library's teardown that never finished). */
  hangOnClose = false;
  readonly #listeners = new Map<string, ((arg?: unknown) => void)[]>();
  #ended = false;

  constructor(readonly topics: string[]) {}

  isPaused(): boolean {
    return this.paused;
  }
  pause(): void {
    this.paused = true;
  }
  resume(): void {
    this.paused = false;
  }
  close(): Promise<void> {
    this.closes++;
    if (this.hangOnClose) return never();
    this.#end();
    return Promise.resolve();
  }
  destroy(): void {
    this.destroyed = true;
    this.#end();
  }
  // deno-lint-ignore no-explicit-any
  on(event: string, listener: (arg: any) => void): void {
    this.#listeners.set(event, [...this.#listeners.get(event) ?? [], listener]);
  }
  // deno-lint-ignore no-explicit-any
  once(event: string, listener: (arg: any) => void): void {
    const once = (arg?: unknown) => {
      this.#listeners.set(event, (this.#listeners.get(event) ?? []).filter((l) => l !== once));
      listener(arg);
    };
    this.on(event, once);
  }
  /** As if a fetch completed with `messages`. */
  fetched(...messages: ConsumedMessage[]): void {
    for (const m of messages) this.#emit("data", m);
    this.#emit("fetch");
  }
  /** As if the stream failed. */
  fail(error: Error): void {
    this.#emit("error", error);
  }
  #end(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#emit("close");
  }
  #emit(event: string, arg?: unknown): void {
    for (const listener of [...this.#listeners.get(event) ?? []]) listener(arg);
  }
}

/** What a fake client does on `consume`: join and hand out a stream, or never answer. */
export type ConsumeScript = "join" | "hang";

/** A scripted group client. */
export class FakeClient implements GroupClient {
  readonly streams: FakeStream[] = [];
  readonly consumes: ConsumeSettings[] = [];
  /** Topics held by each holdMembership call. */
  readonly holds: string[][] = [];
  /** The `force` of each close() call. */
  readonly closes: boolean[] = [];
  /** What each consume does, in order; past the end, "join". */
  readonly script: ConsumeScript[];
  /** The partitions each join assigns per topic (default: partition 0). */
  partitions: number[] = [0];
  #generation = 0;
  #holding: string[] | undefined;

  constructor(readonly events: GroupClientEvents, script: ConsumeScript[] = []) {
    this.script = [...script];
  }

  consume(settings: ConsumeSettings): Promise<FetchStream> {
    this.consumes.push(settings);
    if ((this.script.shift() ?? "join") === "hang") return never();
    // As the library does with its topics held: the same topics again reuse the membership.
    const held = this.#holding?.join() === settings.topics.join();
    this.#holding = undefined;
    if (!held) {
      this.events.joined({
        generationId: ++this.#generation,
        memberId: "fake-member",
        assignments: settings.topics.map((topic) => ({ topic, partitions: this.partitions })),
      });
    }
    const stream = new FakeStream(settings.topics);
    this.streams.push(stream);
    return Promise.resolve(stream);
  }
  holdMembership(topics: string[]): void {
    this.holds.push([...topics]);
    this.#holding ??= [...topics];
  }
  /** As if the group rebalanced and assigned `partitions` of the last topics consumed. */
  rejoined(partitions: number[]): void {
    const topics = this.consumes.at(-1)?.topics ?? [];
    this.events.joined({
      generationId: ++this.#generation,
      memberId: "fake-member",
      assignments: topics.map((topic) => ({ topic, partitions })),
    });
  }
  coordinator(): Promise<BrokerAddress> {
    return Promise.resolve({ host: "127.0.0.1", port: 1 });
  }
  close(force: boolean): Promise<void> {
    this.closes.push(force);
    return Promise.resolve();
  }
  /** The stream handed out last. */
  get stream(): FakeStream | undefined {
    return this.streams.at(-1);
  }
}

/** A factory of fake clients; the n-th client made follows `scripts[n]`. */
export function fakeClients(
  scripts: ConsumeScript[][] = [],
): { factory: (events: GroupClientEvents) => FakeClient; clients: FakeClient[] } {
  const clients: FakeClient[] = [];
  const factory = (events: GroupClientEvents) => {
    const client = new FakeClient(events, scripts[clients.length] ?? []);
    clients.push(client);
    return client;
  };
  return { factory, clients };
}

/** A topic lister answering from a script its siblings share. */
export class FakeLister implements TopicLister {
  closed = false;
  constructor(readonly next: () => string[] | "hang") {}
  listTopics(): Promise<string[]> {
    const answer = this.next();
    return answer === "hang" ? never() : Promise.resolve(answer);
  }
  close(): Promise<void> {
    this.closed = true;
    return Promise.resolve();
  }
}

/**
 * A factory of fake listers: the n-th listTopics call, whichever lister
 * makes it, answers `answers[n]` (a list of topics, or "hang"); past the
 * end, the last answer.
 */
export function fakeListers(answers: (string[] | "hang")[]): {
  factory: () => FakeLister;
  listers: FakeLister[];
  /** listTopics calls so far, each with the time it was made. */
  calls: number[];
} {
  const listers: FakeLister[] = [];
  const calls: number[] = [];
  const factory = () => {
    const lister = new FakeLister(() => {
      calls.push(Date.now());
      return answers[calls.length - 1] ?? answers.at(-1) ?? [];
    });
    listers.push(lister);
    return lister;
  };
  return { factory, listers, calls };
}
