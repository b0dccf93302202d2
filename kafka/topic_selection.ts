/**
 * Which topics the consumer reads: a fixed list, a `RegExp` matched against
 * the broker's topics, or a function, resolved to a sorted list without
 * duplicates.
 */
import type { TopicSelection } from "./consumer.ts";

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

/** Resolves a `TopicSelection`; a `RegExp` asks the broker through a lister made on first use. */
export class TopicSelector {
  #selection: TopicSelection;
  readonly #newLister: () => TopicLister;
  #lister: TopicLister | undefined;

  constructor(selection: TopicSelection, newLister: () => TopicLister) {
    this.#selection = selection;
    this.#newLister = newLister;
  }

  /** Replaces the selection with a fixed list. */
  set(topics: string[]): void {
    this.#selection = [...topics];
  }

  /** The topics selected now, sorted, without duplicates. */
  async resolve(): Promise<string[]> {
    const selection = this.#selection;
    let topics: string[];
    if (Array.isArray(selection)) topics = selection;
    else if (selection instanceof RegExp) {
      this.#lister ??= this.#newLister();
      topics = (await this.#lister.listTopics()).filter((t) => selection.test(t));
    } else topics = await selection();
    return [...new Set(topics)].sort();
  }

  /** Closes the lister, if one was made. */
  async close(): Promise<void> {
    await this.#lister?.close().catch(() => {});
  }
}
