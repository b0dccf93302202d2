/**
 * One partition's state in the inbox relay, as a pure state machine: it is
 * told what happened (a message came, a call failed, a call finished, the
 * group took the partition away, the relay is stopping) and answers what to
 * do (start these calls, let these messages go, hand the partition out
 * again from here). It does no I/O, holds no timer, aborts nothing and
 * counts no metric; the relay does all of that with its answers.
 *
 * - Within the partition up to `maxInFlight` calls run at once; its
 *   `OffsetTracker` keeps commits in offset order whatever order they finish in.
 * - The first transient failure of a message pauses the partition behind it:
 *   every message after it is let go (queued ones dropped, the answers of
 *   calls in flight to be ignored, the tracker forgets those not done yet;
 *   those done already are not done twice) and whatever is offered meanwhile
 *   is dropped. Once no message of it is failing the partition is handed out
 *   again from just after the cut. Nothing is skipped: the tracker never
 *   commits past the failing message, and what was let go comes again.
 * - A message is let go at most once, and its share of the relay's pending
 *   budget is given back exactly once: when it is let go, or else when its
 *   call finishes.
 */
import { OffsetTracker } from "./offsets.ts";

/** What the state machine needs of a message. */
export interface PartitionMessage {
  offset: bigint;
  /** ms since the epoch, for lag in seconds. */
  timestamp: number;
  value: Uint8Array;
}

/** How a call for a job ended: its message is done, or it was given up (it comes again). */
export type Result = "done" | "abandoned";

/** One offered message on its way through the relay. Its flags are written here only. */
export interface Job<M extends PartitionMessage = PartitionMessage> {
  readonly m: M;
  /** Its share of the pending budget (the value's bytes). */
  readonly bytes: number;
  /** The tracker it completes in (a later one replaces it if the topic is recreated). */
  readonly tracker: OffsetTracker;
  /** Its budget share was given back (once). */
  readonly released: boolean;
  /** Let go by a pause or a revocation: fetched again later, never completed from here. */
  readonly evicted: boolean;
  /** Has failed transiently and is being retried (it holds its partition paused). */
  readonly failing: boolean;
  /**
   * Its outcome is decided (admitted, or its dead letter being written) but
   * not yet recorded: never let go, or it would be done twice.
   */
  readonly finishing: boolean;
  /**
   * Cuts its backoff short when it is let go (a call in flight is left to
   * finish). Aborted by the relay, never here.
   */
  readonly cancel: AbortController;
}

type MutableJob<M extends PartitionMessage> = { -readonly [K in keyof Job<M>]: Job<M>[K] };

/** The answer to `offer`. */
export type Offered<M extends PartitionMessage> =
  /** The partition is paused: the message comes again once it resumes. */
  | { kind: "dropped" }
  /** Done before a pause cut it (a fast dead letter, say): done now, not a second time. */
  | { kind: "done-ahead" }
  | {
    kind: "queued";
    /** Take its share of the pending budget. */
    job: Job<M>;
    /** Start calls for these. */
    start: Job<M>[];
    /** Set when offsets went backwards (the topic was recreated): the highest offset seen before. */
    retrackedAfter?: bigint;
  };

/** The answer to `failed`, when the failure paused (or cut further into) the partition. */
export interface Paused<M extends PartitionMessage> {
  /** Give their budget shares back and abort their `cancel`. */
  letGo: Job<M>[];
  /** The partition was running until now (not merely cut further back). */
  newlyPaused: boolean;
  /** Where the partition will be handed out again from. */
  resumeFrom: bigint;
}

/** The answer to `finished`. */
export interface Finished<M extends PartitionMessage> {
  /** Give the job's budget share back (it was not let go). */
  release: boolean;
  /** Its offset was completed in its tracker (count it towards the commit batch). */
  completed: boolean;
  /** Resumed: hand the partition out again from this offset. */
  resumeFrom?: bigint;
  /** Offered messages dropped while it was paused (when resumed). */
  droppedWhilePaused?: number;
  /** Start calls for these. */
  start: Job<M>[];
}

/** The answer to `revoke`. */
export interface Revoked<M extends PartitionMessage> {
  /** Give their budget shares back and abort their `cancel`. */
  letGo: Job<M>[];
  /** Queued messages dropped (not started yet). */
  dropped: number;
  /** It was paused (and is no longer). */
  wasPaused: boolean;
}

/** The state of one partition; see the module comment. */
export class PartitionState<M extends PartitionMessage = PartitionMessage> {
  readonly topic: string;
  readonly partition: number;
  readonly tenant: string;
  readonly #maxInFlight: number;
  #tracker = new OffsetTracker();
  // A queue with a moving head: shift() on a long array is O(n).
  #queue: MutableJob<M>[] = [];
  #head = 0;
  /** Calls running (including let-go ones whose call has not returned yet). */
  readonly #running = new Set<MutableJob<M>>();
  /** Jobs failing and retried, not let go: while > 0 the partition stays paused. */
  #failing = 0;
  /** Set while paused: where the partition is handed out again from. */
  #resumeFrom: bigint | undefined;
  #dropped = 0;
  #revoked = false;
  #halted = false;
  /**
   * Offsets after a pause's cut that were already done when it was cut:
   * when offered again they are done at once, not admitted or dead-lettered
   * a second time.
   */
  readonly #doneAhead = new Set<bigint>();

  constructor(topic: string, partition: number, tenant: string, maxInFlight: number) {
    this.topic = topic;
    this.partition = partition;
    this.tenant = tenant;
    this.#maxInFlight = maxInFlight;
  }

  /** The current tracker: what to commit, and the oldest message not done. */
  get tracker(): OffsetTracker {
    return this.#tracker;
  }

  /** Where the partition resumes from while paused, else undefined. */
  get resumeFrom(): bigint | undefined {
    return this.#resumeFrom;
  }

  /** Calls running, let-go ones included. */
  get running(): number {
    return this.#running.size;
  }

  /** Messages queued, not started yet. */
  get queued(): number {
    return this.#queue.length - this.#head;
  }

  /** A message handed out by the consumer for this partition. */
  offer(m: M): Offered<M> {
    if (this.#resumeFrom !== undefined) {
      this.#dropped++;
      return { kind: "dropped" };
    }
    let retrackedAfter: bigint | undefined;
    const last = this.#tracker.last;
    if (last !== undefined && m.offset <= last) {
      // Offsets from 0 again: calls in flight finish against the old tracker they hold.
      retrackedAfter = last;
      this.#tracker = new OffsetTracker();
      this.#doneAhead.clear();
    }
    this.#tracker.add(m.offset, m.timestamp);
    if (this.#doneAhead.delete(m.offset)) {
      this.#tracker.complete(m.offset);
      return { kind: "done-ahead" };
    }
    const job: MutableJob<M> = {
      m,
      bytes: m.value.byteLength,
      tracker: this.#tracker,
      released: false,
      evicted: false,
      failing: false,
      finishing: false,
      cancel: new AbortController(),
    };
    this.#queue.push(job);
    return { kind: "queued", job, start: this.#start(), retrackedAfter };
  }

  /** The job's outcome is decided: from now on it is finished, never let go. */
  decided(job: Job<M>): void {
    (job as MutableJob<M>).finishing = true;
  }

  /**
   * The job's call failed transiently and will be retried. Its first
   * failure pauses the partition behind it; later ones change nothing.
   */
  failed(job: Job<M>): Paused<M> | undefined {
    const j = job as MutableJob<M>;
    if (j.failing || j.evicted) return undefined;
    j.failing = true;
    this.#failing++;
    return this.#pause(j);
  }

  /** The job's call returned (`done`: admitted or dead-lettered). */
  finished(job: Job<M>, result: Result): Finished<M> {
    const j = job as MutableJob<M>;
    this.#running.delete(j);
    const release = !j.released;
    j.released = true;
    if (j.failing) {
      j.failing = false;
      this.#failing--;
    }
    // A let-go message was forgotten by the tracker and comes again.
    const completed = result === "done" && !j.evicted;
    if (completed) j.tracker.complete(j.m.offset);
    const answer: Finished<M> = { release, completed, start: [] };
    if (
      !this.#revoked && !this.#halted && this.#resumeFrom !== undefined && this.#failing === 0
    ) {
      answer.resumeFrom = this.#resumeFrom;
      answer.droppedWhilePaused = this.#dropped;
      this.#resumeFrom = undefined;
      this.#dropped = 0;
    }
    answer.start = this.#start();
    return answer;
  }

  /**
   * The group gave the partition to another member, which starts from the
   * committed offset: queued messages are dropped, retries stop, calls in
   * flight run to their end unheeded (except those whose outcome is decided),
   * and nothing more is started or resumed.
   */
  revoke(): Revoked<M> {
    this.#revoked = true;
    const letGo = this.#letGoQueued();
    const dropped = letGo.length;
    for (const job of this.#running) {
      if (job.finishing || job.evicted) continue;
      this.#letGo(job);
      letGo.push(job);
    }
    const wasPaused = this.#resumeFrom !== undefined;
    this.#resumeFrom = undefined;
    return { letGo, dropped, wasPaused };
  }

  /** The relay is stopping: nothing more is started or resumed. */
  halt(): void {
    this.#halted = true;
  }

  /** Lets every queued message go (at a stop: left for the next owner); give their shares back. */
  dropQueued(): Job<M>[] {
    return this.#letGoQueued();
  }

  #start(): Job<M>[] {
    const started: Job<M>[] = [];
    while (
      !this.#revoked && !this.#halted && this.#resumeFrom === undefined &&
      this.#running.size < this.#maxInFlight && this.#head < this.#queue.length
    ) {
      const job = this.#queue[this.#head++];
      if (this.#head === this.#queue.length) {
        this.#queue = [];
        this.#head = 0;
      } else if (this.#head > 1024 && this.#head * 2 > this.#queue.length) {
        this.#queue = this.#queue.slice(this.#head);
        this.#head = 0;
      }
      this.#running.add(job);
      started.push(job);
    }
    return started;
  }

  /** Pauses the partition behind `failed`: every message after it is let go. */
  #pause(failed: MutableJob<M>): Paused<M> | undefined {
    const offset = failed.m.offset;
    const wasPaused = this.#resumeFrom !== undefined;
    if (wasPaused && this.#resumeFrom! <= offset + 1n) return undefined;
    // A message after it whose outcome is decided is finished, not let go:
    // the cut moves past it (those in between keep going).
    let cut = offset;
    for (const job of this.#running) {
      if (job.finishing && !job.evicted && job.m.offset > cut) cut = job.m.offset;
    }
    const letGo = this.#letGoQueued();
    for (const job of this.#running) {
      if (job.m.offset <= cut || job.evicted) continue;
      // Only its backoff is cut short: a call in flight runs to its end (its
      // answer is ignored), since a request abandoned mid-body is an error the
      // API has to log for nothing.
      this.#letGo(job);
      letGo.push(job);
    }
    // A job of a tracker replaced since (the topic was recreated) has nothing to forget there.
    const tracker = this.#tracker;
    if (failed.tracker === tracker && tracker.last !== undefined && tracker.last > cut) {
      for (const done of tracker.doneAfter(cut)) this.#doneAhead.add(done);
      tracker.forgetAfter(cut);
    }
    this.#resumeFrom = cut + 1n;
    return { letGo, newlyPaused: !wasPaused, resumeFrom: this.#resumeFrom };
  }

  #letGoQueued(): MutableJob<M>[] {
    const letGo: MutableJob<M>[] = [];
    for (let i = this.#head; i < this.#queue.length; i++) {
      const job = this.#queue[i];
      this.#letGo(job);
      letGo.push(job);
    }
    this.#queue = [];
    this.#head = 0;
    return letGo;
  }

  #letGo(job: MutableJob<M>): void {
    job.evicted = true;
    job.released = true;
    if (job.failing) {
      job.failing = false;
      this.#failing--;
    }
  }
}
