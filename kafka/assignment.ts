/**
 * What the group last assigned to this member, and under which membership:
 * commits are sent as that membership (fenced_commit.ts), and what a new
 * assignment no longer holds is what was revoked.
 */
import { partitionKey } from "./client.ts";
import type { TopicPartition } from "./consumer.ts";
import type { GroupJoin } from "./group_client.ts";

/** A group membership: commits sent as it are refused once the group moved on. */
export interface Membership {
  generationId: number;
  memberId: string;
}

/** This member's partitions, as the group's joins told them. */
export class Assignment {
  // By partitionKey; undefined before the first join, when nothing can have been revoked.
  #owned: Map<string, TopicPartition> | undefined;
  #member: Membership | undefined;

  /** The partitions last assigned; undefined until first joined. */
  get partitions(): TopicPartition[] | undefined {
    return this.#owned && [...this.#owned.values()];
  }

  /** The membership the partitions were assigned under; undefined when none is held. */
  get member(): Membership | undefined {
    return this.#member;
  }

  /** Whether `partition` of `topic` is assigned here (false before the first join). */
  owns(topic: string, partition: number): boolean {
    return this.#owned?.has(partitionKey(topic, partition)) ?? false;
  }

  /** Whether a partition was ever assigned or is assigned now; false before the first join. */
  get known(): boolean {
    return this.#owned !== undefined;
  }

  /** Whether a partition of one of `topics` is assigned here. */
  ownsAnyOf(topics: readonly string[]): boolean {
    const wanted = new Set(topics);
    for (const { topic } of this.#owned?.values() ?? []) if (wanted.has(topic)) return true;
    return false;
  }

  /** Records a join's assignment; returns what the previous one held and this one does not. */
  joined(join: GroupJoin): TopicPartition[] {
    this.#member = join.generationId !== undefined && join.memberId
      ? { generationId: join.generationId, memberId: join.memberId }
      : undefined;
    return this.#assign(join.assignments);
  }

  /** The membership is gone (left, or its client dropped); returns what it held. */
  lost(): TopicPartition[] {
    return this.#assign([]);
  }

  #assign(assignments: GroupJoin["assignments"]): TopicPartition[] {
    if (assignments.length === 0) this.#member = undefined;
    const now = new Map<string, TopicPartition>();
    for (const { topic, partitions } of assignments) {
      for (const partition of partitions) {
        now.set(partitionKey(topic, partition), { topic, partition });
      }
    }
    const before = this.#owned;
    this.#owned = now;
    if (!before) return [];
    return [...before].filter(([key]) => !now.has(key)).map(([, tp]) => tp);
  }
}
