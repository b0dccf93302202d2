/**
 * Administrative operations: idempotent topic declaration, listing, deletion
 * and the offsets a lag metric needs.
 */
import { Admin, ConfigResourceTypes } from "@platformatic/kafka";
import { delay, SECOND } from "../core/time.ts";
import {
  baseOptions,
  isApiError,
  type KafkaClientOptions,
  reportingFailures,
  type TopicPartitionOffset,
} from "./client.ts";

/** A topic to declare. */
export interface TopicSpec {
  name: string;
  partitions: number;
  replicationFactor: number;
  /** Topic-level configuration, e.g. `{"retention.ms": "604800000"}`. */
  configs?: Record<string, string>;
}

/** Administrative operations. */
export interface KafkaAdmin {
  /**
   * Creates the topics that are missing (one that already exists counts as
   * success) and resolves once the new ones are visible in the metadata.
   */
  createTopics(topics: TopicSpec[]): Promise<{ created: string[]; existing: string[] }>;
  /** Names of all non-internal topics. */
  listTopics(): Promise<string[]>;
  /** Deletes topics; one that does not exist counts as success. */
  deleteTopics(topics: string[]): Promise<void>;
  /** The values of a topic's configuration entries (all of them, or those named). */
  topicConfig(topic: string, names?: string[]): Promise<Record<string, string>>;
  /**
   * `topicConfig` of each of `topics` that exists (effective values: the
   * broker's default where the topic sets none), asked in a few requests.
   */
  topicConfigs(topics: string[], names?: string[]): Promise<Map<string, Record<string, string>>>;
  /** Partition count of each of `topics` that exists. */
  partitionCounts(topics: string[]): Promise<Map<string, number>>;
  /**
   * Committed offsets (next offset to read) of `groupId`, for every partition
   * it has committed on (restricted to `topics` when given), sorted.
   */
  committedOffsets(groupId: string, topics?: string[]): Promise<TopicPartitionOffset[]>;
  /**
   * The group's state as its coordinator reports it ("Stable",
   * "PreparingRebalance", "Empty", "Dead" …) and how many members it has.
   */
  groupState(groupId: string): Promise<{ state: string; members: number }>;
  /** End (high-water) offset of every partition of `topics` (the next message's offset), sorted. */
  endOffsets(topics: string[]): Promise<TopicPartitionOffset[]>;
  /** Earliest offset still held (after retention) of every partition of `topics`, sorted. */
  startOffsets(topics: string[]): Promise<TopicPartitionOffset[]>;
  close(): Promise<void>;
}

// Topics described per DescribeConfigs request.
const TOPICS_PER_DESCRIBE = 100;

function sortOffsets(offsets: TopicPartitionOffset[]): TopicPartitionOffset[] {
  return offsets.sort((a, b) =>
    a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition
  );
}

/** Creates an admin client; connects on first use. */
export function createAdmin(opts: KafkaClientOptions & { retries?: number }): KafkaAdmin {
  const admin = new Admin({ ...baseOptions(opts), retries: opts.retries ?? 3 });
  let closed = false;

  async function partitionCounts(topics: string[]): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    if (topics.length === 0) return out;
    // Asked one by one: a metadata request naming a missing topic fails as a whole.
    const existing = new Set(await admin.listTopics());
    const wanted = topics.filter((t) => existing.has(t));
    if (wanted.length === 0) return out;
    const metadata = await admin.metadata({ topics: wanted, forceUpdate: true });
    for (const t of wanted) {
      const meta = metadata.topics.get(t);
      if (meta) out.set(t, meta.partitionsCount);
    }
    return out;
  }

  async function offsetsAt(topics: string[], timestamp: bigint): Promise<TopicPartitionOffset[]> {
    const counts = await partitionCounts(topics);
    if (counts.size === 0) return [];
    const listed = await admin.listOffsets({
      topics: [...counts].map(([name, n]) => ({
        name,
        partitions: Array.from({ length: n }, (_, partitionIndex) => ({
          partitionIndex,
          timestamp,
        })),
      })),
    });
    return sortOffsets(
      listed.flatMap((t) =>
        t.partitions.map((p) => ({ topic: t.name, partition: p.partitionIndex, offset: p.offset }))
      ),
    );
  }

  return reportingFailures("kafka admin", {
    async createTopics(specs) {
      const created: string[] = [];
      const existing: string[] = [];
      // One request per topic: the library fails a whole batch when any topic
      // of it already exists, and declaration is rare.
      for (const spec of specs) {
        try {
          await admin.createTopics({
            topics: [spec.name],
            partitions: spec.partitions,
            replicas: spec.replicationFactor,
            configs: Object.entries(spec.configs ?? {}).map(([name, value]) => ({ name, value })),
          });
          created.push(spec.name);
        } catch (error) {
          if (!isApiError(error, "TOPIC_ALREADY_EXISTS")) throw error;
          existing.push(spec.name);
        }
      }
      // The controller answers before the brokers' metadata caught up; wait,
      // so that a declared topic can be produced to and listed at once.
      const deadline = Date.now() + 10 * SECOND;
      while (created.length > 0 && Date.now() < deadline) {
        const listed = new Set(await admin.listTopics());
        if (created.every((t) => listed.has(t))) break;
        await delay(50);
      }
      return { created, existing };
    },
    listTopics() {
      return admin.listTopics({ includeInternals: false });
    },
    async deleteTopics(topics) {
      for (const topic of topics) {
        try {
          await admin.deleteTopics({ topics: [topic] });
        } catch (error) {
          if (!isApiError(error, "UNKNOWN_TOPIC_OR_PARTITION")) throw error;
        }
      }
    },
    partitionCounts,
    async topicConfig(topic, names) {
      const [described] = await admin.describeConfigs({
        resources: [{
          resourceType: ConfigResourceTypes.TOPIC,
          resourceName: topic,
          configurationKeys: names ?? null,
        }],
      });
      const out: Record<string, string> = {};
      for (const c of described?.configs ?? []) if (c.value != null) out[c.name] = c.value;
      return out;
    },
    async topicConfigs(topics, names) {
      const out = new Map<string, Record<string, string>>();
      // A request naming a missing topic fails as a whole: existing ones only.
      const existing = new Set(await admin.listTopics());
      const wanted = topics.filter((t) => existing.has(t));
      for (let i = 0; i < wanted.length; i += TOPICS_PER_DESCRIBE) {
        const described = await admin.describeConfigs({
          resources: wanted.slice(i, i + TOPICS_PER_DESCRIBE).map((name) => ({
            resourceType: ConfigResourceTypes.TOPIC,
            resourceName: name,
            configurationKeys: names ?? null,
          })),
        });
        for (const d of described) {
          const values: Record<string, string> = {};
          for (const c of d.configs) if (c.value != null) values[c.name] = c.value;
          out.set(d.resourceName, values);
        }
      }
      return out;
    },
    async groupState(groupId) {
      const group = (await admin.describeGroups({ groups: [groupId] })).get(groupId);
      return { state: String(group?.state ?? "Dead"), members: group?.members.size ?? 0 };
    },
    async committedOffsets(groupId, topics) {
      const groups = await admin.listConsumerGroupOffsets({ groups: [groupId] });
      const wanted = topics ? new Set(topics) : undefined;
      const out: TopicPartitionOffset[] = [];
      for (const group of groups) {
        for (const topic of group.topics) {
          if (wanted && !wanted.has(topic.name)) continue;
          for (const p of topic.partitions) {
            // -1 means "nothing committed on this partition".
            if (p.committedOffset < 0n) continue;
            out.push({ topic: topic.name, partition: p.partitionIndex, offset: p.committedOffset });
          }
        }
      }
      return sortOffsets(out);
    },
    // Timestamp -1 asks for the latest offset (the high-water mark), -2 for the earliest.
    endOffsets: (topics) => offsetsAt(topics, -1n),
    startOffsets: (topics) => offsetsAt(topics, -2n),
    async close() {
      if (closed) return;
      closed = true;
      await admin.close();
    },
  });
}
