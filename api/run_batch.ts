/**
 * Batch admission: `POST /v1/runs` with a JSON array of run requests,
 * answered 207 with one result per item, in order. Each item is validated
 * and admitted exactly as a single request (api/run_admit.ts: the reserved
 * keys, the tenant's quota gate, the admission kernel), so one bad item is
 * its own problem and never fails the others. The items are handed to the
 * kernel together: its group commit makes a batch a few round trips, not
 * one per item. Items with the same dispatch key are admitted in their
 * order, each after the one before, so the first is the one created.
 */
import type { Context } from "hono";
import { PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { activeTraceparent, inSpan, remoteContext, validTraceparent } from "../core/tracing.ts";
import type { Admission, AdmitResult } from "../admission/admit.ts";
import type { QuotaGate } from "../admission/quota.ts";
import { HEADERS, RunRequest } from "../contracts/runs.ts";
import {
  type ItemSource,
  parseItemSources,
  RUN_BATCH_MAX_ITEMS,
  type RunBatchAnswer,
  type RunBatchResult,
} from "../contracts/run_batch.ts";
import type { ApiEnv } from "./app.ts";
import type { ApiMetrics } from "./metrics.ts";
import {
  admissionOutcome,
  type AdmitCaller,
  admitCaller,
  admitChecked,
  debouncedRun,
  refuseReservedKey,
} from "./run_admit.ts";
import { problemOf } from "./problem.ts";
import { parseWith } from "./request.ts";
import { toRun } from "./run_json.ts";

/** What a batch needs. */
export interface BatchDeps {
  admission: Admission;
  quota?: QuotaGate;
  metrics: ApiMetrics;
  log: Logger;
}

/**
 * Answers a batch whose body parsed to `items` (an array): 422 for the
 * whole request when it is empty, longer than `RUN_BATCH_MAX_ITEMS` or sent
 * with `Idempotency-Key` (a key for many runs would be ambiguous: each item
 * carries its own `dispatch_key`) or, from a service token, `Poimen-Source`
 * (its `Poimen-Sources` names each item's source instead);
 * otherwise 207 with each item's result.
 * `Prefer: wait` is ignored: a batch answers as soon as it is admitted.
 */
export async function answerBatch(
  deps: BatchDeps,
  c: Context<ApiEnv>,
  items: unknown[],
): Promise<Response> {
  const started = performance.now();
  if (c.req.header(HEADERS.idempotencyKey) !== undefined) {
    throw new PoimenError("validation", "the request does not match the schema", {
      errors: [{
        path: `header.${HEADERS.idempotencyKey}`,
        message: "not with a batch: give each item its dispatch_key",
      }],
    });
  }
  // A source names one request: a batch's items cannot share one. Refused,
  // so a Kafka message whose value is an array is dead-lettered as before,
  // not admitted as runs its redelivery would admit again. The relay's own
  // batches say each item's source in Poimen-Sources.
  const service = c.get("principal").kind === "service";
  if (c.req.header(HEADERS.source) !== undefined && service) {
    throw new PoimenError("validation", "the request does not match the schema", {
      errors: [{
        path: `header.${HEADERS.source}`,
        message:
          `not with a batch: a source names one request (${HEADERS.sources} names each item's)`,
      }],
    });
  }
  if (items.length === 0 || items.length > RUN_BATCH_MAX_ITEMS) {
    throw new PoimenError("validation", "the request does not match the schema", {
      errors: [{
        path: "(body)",
        message: `a batch holds 1 to ${RUN_BATCH_MAX_ITEMS} run requests`,
      }],
    });
  }
  const caller = admitCaller(c);
  const sources = service ? itemSources(c.req.header(HEADERS.sources), items.length) : undefined;
  const where = { method: c.req.method, path: c.req.path };
  const log = oncePerKind(deps.log);
  const results = await Promise.all(admitAll(deps, caller, items, sources));
  // The parsed items are no longer held: the body's budget share goes back.
  c.get("releaseBody")?.();
  const seconds = (performance.now() - started) / 1000;
  const answer: RunBatchAnswer = {
    results: results.map((r): RunBatchResult => {
      if ("error" in r) {
        deps.metrics.observeAdmission("rejected", seconds);
        const { problem } = problemOf(r.error, log, where);
        return { outcome: "problem", status: problem.status, problem };
      }
      deps.metrics.observeAdmission(admissionOutcome(r), seconds);
      const run = debouncedRun(r, toRun(r.run));
      if (r.created) return { outcome: "created", status: 201, run };
      if (r.debounced) return { outcome: "debounced", status: 200, run };
      if (!r.sameBody) deps.metrics.replayBodyMismatch.inc();
      const result: RunBatchResult = { outcome: "replayed", status: 200, run };
      if (!r.sameBody) result.body_mismatch = true;
      return result;
    }),
  };
  return c.json(answer, 207);
}

/**
 * Starts every item's admission, in order: the quota gate sees them in the
 * items' order, as it would single requests sent one after another. Never
 * rejects: an item's failure is its result.
 */
function admitAll(
  deps: BatchDeps,
  caller: AdmitCaller,
  items: unknown[],
  sources: ItemSource[] | undefined,
): Promise<AdmitResult | { error: unknown }>[] {
  // The admission of the last item seen with each dispatch key.
  const last = new Map<string, Promise<unknown>>();
  return items.map((item, i) => {
    const source = sources?.[i];
    const itemCaller = source ? { ...caller, source: source.source } : caller;
    let body: RunRequest;
    try {
      body = parseWith(RunRequest, item);
      refuseReservedKey(body, false, itemCaller);
    } catch (error) {
      return Promise.resolve({ error });
    }
    const key = body.dispatch_key;
    const before = key == null ? undefined : last.get(key);
    const admitted = admitItem(deps, itemCaller, body, source?.traceparent, before)
      .catch((error) => ({ error }));
    if (key != null) last.set(key, admitted);
    return admitted;
  });
}

/**
 * One item's admission; an item with its own trace (a relayed message's) is
 * admitted in a span of that trace, and its run stored with it, as a single
 * request with that `traceparent` would be.
 */
function admitItem(
  deps: BatchDeps,
  caller: AdmitCaller,
  body: RunRequest,
  traceparent: string | undefined,
  before: Promise<unknown> | undefined,
): Promise<AdmitResult> {
  const parent = validTraceparent(traceparent);
  if (!parent) return admitChecked(deps, caller, body, before);
  return inSpan(
    "poimen admit item",
    remoteContext(parent),
    { "poimen.source": caller.source },
    () =>
      admitChecked(deps, { ...caller, traceparent: activeTraceparent() ?? parent }, body, before),
  );
}

/**
 * Each item's source from a service token's `Poimen-Sources`, or undefined
 * without one (every item then is the token's own, `http:<name>`); a header
 * that does not name every item is the whole request's 422.
 */
function itemSources(header: string | undefined, count: number): ItemSource[] | undefined {
  if (header === undefined) return undefined;
  const parsed = parseItemSources(header, count);
  if (typeof parsed !== "string") return parsed;
  throw new PoimenError("validation", "the request does not match the schema", {
    errors: [{ path: `header.${HEADERS.sources}`, message: parsed }],
  });
}

/**
 * `log`, with each warning or error line written once per message and code:
 * a database outage fails a batch's 1,000 items alike, and is one line.
 */
function oncePerKind(log: Logger): Logger {
  const seen = new Set<string>();
  const once = (level: "warn" | "error") => (msg: string, fields?: Record<string, unknown>) => {
    const kind = `${level} ${msg} ${String(fields?.code)}`;
    if (seen.has(kind)) return;
    seen.add(kind);
    log[level](msg, fields);
  };
  return {
    debug: (msg, fields) => log.debug(msg, fields),
    info: (msg, fields) => log.info(msg, fields),
    warn: once("warn"),
    error: once("error"),
    with: (fields) => log.with(fields),
  };
}
