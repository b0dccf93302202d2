/**
 * Batches of dispatch messages (issue 32): the messages of one tenant that
 * are ready together go to `POST /v1/runs` as one batch request (an array,
 * answered 207 with each item's result), not one request each. The relay
 * stays an HTTP client of the public API; only the number of requests
 * changes. Each message keeps its own fate: its item's result is classified
 * exactly as a single answer would be (`outcomeOf`), and relay/inbox.ts
 * retries, dead-letters or completes it as before, so a poison message in a
 * batch is dead-lettered while its neighbours are admitted.
 *
 * The group commit of core/batcher.ts gathers them: no timer, the first
 * message goes at once and those ready while a tenant's `maxConcurrent`
 * batches are in flight go in the next, so batches grow only as fast as the
 * API is the bottleneck. Each item's place in Kafka (its source, which keys
 * a keyless message's run) and trace ride in the `Poimen-Sources` header; a
 * batch is cut to keep that header and the body within bounds a proxy in
 * front of the API accepts.
 *
 * An answer about the whole request is no verdict on any message: a
 * transient one (503, 429, no answer) is every item's transient outcome,
 * retried as usual; anything else a batch should never get (a 4xx, an
 * answer that is not a 207 of as many results) sends each item alone, and
 * its own answer decides.
 */
import { Batcher } from "../core/batcher.ts";
import { HEADERS } from "../contracts/runs.ts";
import { formatItemSources } from "../contracts/run_batch.ts";
import type { ApiAnswer } from "../client/problems.ts";
import type { AdmitRequest, Outcome, TraceHeaders } from "./api_client.ts";
import { outcomeOf, PERMANENT_PROBLEMS } from "./api_client.ts";

/** How dispatch messages are batched (relay/config.ts: RELAY_BATCH_*). */
export interface AdmitBatchOptions {
  /** Most messages in one request; 1 sends each alone. */
  maxItems: number;
  /** Most bytes of message values in one request (the API's BODY_LIMIT_BYTES must allow it). */
  maxBytes: number;
  /** Batch requests in flight at once per tenant. */
  maxConcurrent: number;
}

/** One message waiting for its tenant's next batch. */
export interface BatchItem {
  req: AdmitRequest;
  trace: TraceHeaders;
  signal?: AbortSignal;
}

/** What the batcher sends with: the client's own calls. */
export interface BatchTransport {
  /** One message alone, as without batching. */
  single(item: BatchItem): Promise<Outcome>;
  /** One request; no answer at all is a transient `Outcome`. */
  send(
    path: string,
    headers: Record<string, string>,
    body: Uint8Array,
    signal?: AbortSignal,
  ): Promise<ApiAnswer | Outcome>;
}

/**
 * `Poimen-Sources` bytes at most: under the 8 KiB a header line may take in
 * common proxies' defaults (nginx's `large_client_header_buffers`).
 */
export const MAX_SOURCES_HEADER = 7_000;

const COMMA = 44;
const OPEN = 91;
const CLOSE = 93;

/** Coalesces each tenant's dispatch messages into batch requests; see the module comment. */
export class AdmitBatcher {
  readonly #opts: AdmitBatchOptions;
  readonly #transport: BatchTransport;
  readonly #tenants = new Map<string, Batcher<BatchItem, Outcome>>();

  constructor(opts: AdmitBatchOptions, transport: BatchTransport) {
    this.#opts = opts;
    this.#transport = transport;
  }

  /** Sends `item` in its tenant's next batch; resolves with its own outcome, never rejects. */
  admit(item: BatchItem): Promise<Outcome> {
    const tenant = item.req.tenant;
    let batcher = this.#tenants.get(tenant);
    if (!batcher) {
      batcher = new Batcher((items) => this.#flush(tenant, items), {
        maxBatch: this.#opts.maxItems,
        maxConcurrent: this.#opts.maxConcurrent,
        // Messages handed out by one fetch start in one turn: one batch.
        gatherTurn: true,
      });
      this.#tenants.set(tenant, batcher);
    }
    return batcher.submit(item);
  }

  /** A tenant's gathered messages, cut into requests within the bounds, sent together. */
  async #flush(tenant: string, items: BatchItem[]): Promise<Outcome[]> {
    const parts = await Promise.all(
      cut(items, this.#opts.maxBytes).map((part) =>
        part.length === 1 ? [this.#transport.single(part[0])] : this.#post(tenant, part)
      ),
    );
    return await Promise.all(parts.flat());
  }

  async #post(tenant: string, items: BatchItem[]): Promise<Promise<Outcome>[]> {
    const headers: Record<string, string> = {
      "content-type": "application/json",
      [HEADERS.tenant]: tenant,
      [HEADERS.sources]: formatItemSources(
        items.map((i) => ({ source: i.req.source, traceparent: i.trace.traceparent })),
      ),
    };
    // The values verbatim, byte for byte, between brackets and commas.
    const size = items.reduce((n, i) => n + i.req.body.byteLength + 1, 1);
    const body = new Uint8Array(size);
    let at = 0;
    body[at++] = OPEN;
    for (const [n, item] of items.entries()) {
      if (n > 0) body[at++] = COMMA;
      body.set(item.req.body, at);
      at += item.req.body.byteLength;
    }
    body[at] = CLOSE;
    // Every item's signal is the relay's one hard stop.
    const answer = await this.#transport.send("/v1/runs", headers, body, items[0].signal);
    if ("kind" in answer) return items.map(() => Promise.resolve(answer));
    const results = answer.status === 207 ? itemResults(answer, items.length) : undefined;
    if (results) {
      return results.map((r) =>
        Promise.resolve(outcomeOf(
          { status: r.status, headers: answer.headers, text: JSON.stringify(r.problem ?? {}) },
          PERMANENT_PROBLEMS,
        ))
      );
    }
    const whole = outcomeOf(answer, PERMANENT_PROBLEMS);
    if (whole.kind === "transient" && answer.status !== 207) {
      return items.map(() => Promise.resolve(whole));
    }
    return items.map((item) => this.#transport.single(item));
  }
}

/** One item's result in a 207, as far as the relay reads it. */
interface ItemResult {
  status: number;
  problem?: unknown;
}

/**
 * A 207's results, when they are one per item, each with a status (and a
 * problem object when it is one); undefined for anything else. Read, not
 * parsed against the full schema: the runs in it are not the relay's concern.
 */
function itemResults(answer: ApiAnswer, count: number): ItemResult[] | undefined {
  let parsed: { results?: unknown };
  try {
    parsed = JSON.parse(answer.text);
  } catch {
    return undefined;
  }
  const results = parsed?.results;
  if (!Array.isArray(results) || results.length !== count) return undefined;
  const wellFormed = results.every((r) =>
    typeof r === "object" && r !== null && Number.isInteger(r.status) &&
    (r.outcome === "problem"
      ? typeof r.problem === "object" && r.problem !== null && r.status >= 400
      : (r.outcome === "created" || r.outcome === "replayed") && r.status < 300)
  );
  return wellFormed ? results : undefined;
}

/**
 * `items` in order, cut into requests of at most `maxBytes` of values and a
 * `Poimen-Sources` header of at most `MAX_SOURCES_HEADER` bytes; a message
 * over `maxBytes` alone is a request of its own.
 */
export function cut(items: BatchItem[], maxBytes: number): BatchItem[][] {
  const parts: BatchItem[][] = [];
  let part: BatchItem[] = [];
  let bytes = 0;
  let header = 0;
  for (const item of items) {
    const size = item.req.body.byteLength;
    const entry = item.req.source.length + (item.trace.traceparent?.length ?? 0) + 2;
    if (part.length > 0 && (bytes + size > maxBytes || header + entry > MAX_SOURCES_HEADER)) {
      parts.push(part);
      part = [];
      bytes = 0;
      header = 0;
    }
    part.push(item);
    bytes += size;
    header += entry;
  }
  if (part.length > 0) parts.push(part);
  return parts;
}
