/**
 * Which topics the consumer reads: a fixed list, a `RegExp` matched against
 * the broker's topics, or a function, resolved to a sorted list without
 * duplicates. A resolution that asks the broker (or the function) is
 * bounded in time and single-flight: the consumer's periodic refresh and its
 * supervisor share the one under way, so a listing that hangs holds one call,
 * not one per refresh tick.
 */
import type { TopicSelection } from "./consumer.ts";
import { type Settled, settleWithin } from "./deadline.ts";

/** What a `RegExp` selection needs of an admin client (`KafkaAdmin` has it). */
export interface TopicLister {
  /** Names of all non-internal topics. */
  listTopics(): Promise<string[]>;
  close(): Promise<void>;
}

/** Whether two sorted topic lists are the same. */
export function sameTopics(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((t, i) => t === b[i]);
}

/** Options of `TopicSelector`. */
export interface TopicSelectorOptions {
  /** Makes the lister a `RegExp` selection asks, on first use and after one hung. */
  newLister: () => TopicLister;
  /** How long a resolution may take, in ms; then it is given up on. */
  timeoutMs: number;
  /** Told each time a resolution was given up on. */
  onTimeout?: () => void;
}

function normalized(topics: string[]): string[] {
  return [...new Set(topics)].sort();
}

/** Resolves a `TopicSelection`; see the module's comment. */
export class TopicSelector {
  #selection: TopicSelection;
  readonly #opts: TopicSelectorOptions;
  readonly #stop: AbortSignal;
  #lister: TopicLister | undefined;
  #inFlight: { selection: TopicSelection; settled: Promise<Settled<string[]>> } | undefined;

  constructor(selection: TopicSelection, opts: TopicSelectorOptions, stop: AbortSignal) {
    this.#selection = selection;
    this.#opts = opts;
    this.#stop = stop;
  }

  /** Replaces the selection with a fixed list. */
  set(topics: string[]): void {
    this.#selection = [...topics];
  }

  /**
   * The topics selected now, sorted, without duplicates; "timed-out" when
   * asking took longer than `timeoutMs` (the next call asks again), "stopped"
   * when the stop signal aborted first. Rejects when asking failed.
   */
  resolve(): Promise<Settled<string[]>> {
    const selection = this.#selection;
    if (Array.isArray(selection)) return Promise.resolve({ value: normalized(selection) });
    // Joined only while it resolves the selection asked for: one replaced
    // meanwhile is asked anew.
    const flight = this.#inFlight;
    if (flight && flight.selection === selection) return flight.settled;
    const settled = this.#ask(selection).finally(() => {
      if (this.#inFlight?.settled === settled) this.#inFlight = undefined;
    });
    this.#inFlight = { selection, settled };
    return settled;
  }

  async #ask(selection: RegExp | (() => string[] | Promise<string[]>)): Promise<Settled<string[]>> {
    const lister = selection instanceof RegExp ? (this.#lister ??= this.#opts.newLister()) : null;
    const work = (async () =>
      normalized(
        lister
          ? (await lister.listTopics()).filter((t) => (selection as RegExp).test(t))
          : await (selection as () => string[] | Promise<string[]>)(),
      ))();
    const outcome = await settleWithin(work, this.#opts.timeoutMs, this.#stop);
    if (outcome !== "timed-out") return outcome;
    this.#opts.onTimeout?.();
    // @platformatic/kafka 2.12.1 has been seen to leave listTopics without
    // an answer for good, and it shares a metadata request under way among
    // callers: the next listing goes through a lister of its own.
    if (lister && this.#lister === lister) {
      this.#lister = undefined;
      void lister.close().catch(() => {});
    }
    return outcome;
  }

  /** Closes the lister, if one was made. */
  async close(): Promise<void> {
    await this.#lister?.close().catch(() => {});
  }
}
