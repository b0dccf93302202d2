/**
 * What the inbox relay makes of a message, by its topic: a dispatch message
 * (`poimen.<tenant>.dispatch`) is posted to `POST /v1/runs`, a signal message
 * (`poimen.<tenant>.signals`) to `POST /v1/runs/{run_id}/signals`. Both go
 * one way from there (relay/inbox.ts): the same classification of answers,
 * the same retries and pause of the partition, the same dead letters. Only
 * the call, and which answers can never turn into a success, differ.
 *
 * Either message's place in Kafka, `kafka:<topic>/<partition>/<offset>`, is
 * the request's `Poimen-Source` and the identity of a message that has none
 * of its own (a dispatch key, a signal id): a redelivered message is one run,
 * or one signal, however often it is relayed.
 */
import { formatPath } from "../contracts/json_value.ts";
import { SignalMessage } from "../contracts/signals.ts";
import { DISPATCH_TOPIC_PATTERN, SIGNALS_TOPIC_PATTERN } from "../contracts/topics.ts";
import type { ConsumedMessage } from "../kafka/consumer.ts";
import { type ApiClient, derivedDispatchKey, type Outcome, prepareBody } from "./api_client.ts";

/** The two kinds of message the relay drains. */
export type InboxKind = "dispatch" | "signal";

/** The tenant and kind of an inbox topic, or undefined for any other topic. */
export function inboxTopic(topic: string): { tenant: string; kind: InboxKind } | undefined {
  const dispatch = DISPATCH_TOPIC_PATTERN.exec(topic)?.[1];
  if (dispatch !== undefined) return { tenant: dispatch, kind: "dispatch" };
  const signals = SIGNALS_TOPIC_PATTERN.exec(topic)?.[1];
  return signals === undefined ? undefined : { tenant: signals, kind: "signal" };
}

/** A message ready to send (`call`, made again at each retry), or why it never can be. */
export type PreparedMessage =
  | {
    kind: InboxKind;
    call: (api: ApiClient, cancelled: AbortSignal) => Promise<Outcome>;
    /** Whether its identity (dispatch key, signal id) is the derived one. */
    derived: boolean;
  }
  | {
    kind: InboxKind;
    /** The dead letter's reason: `bad-json` or `validation`. */
    reason: string;
    detail: string;
  };

/**
 * Prepares a message of an inbox topic of `tenant` (the relay's
 * subscription holds only those): see the module's comment.
 */
export function prepareMessage(m: ConsumedMessage, tenant: string): PreparedMessage {
  // A dispatch topic never ends so: the tenant id has no dot.
  const kind: InboxKind = m.topic.endsWith(".signals") ? "signal" : "dispatch";
  const at = derivedDispatchKey(m.topic, m.partition, m.offset);
  const trace = { traceparent: m.headers.traceparent, tracestate: m.headers.tracestate };
  if (kind === "dispatch") {
    const prepared = prepareBody(m.value, at);
    if ("error" in prepared) return { kind, reason: "bad-json", detail: prepared.error };
    const request = { tenant, body: prepared.body, source: at, alone: prepared.alone, ...trace };
    return {
      kind,
      call: (api, cancelled) => api.admit(request, cancelled),
      derived: prepared.derivedKey !== undefined,
    };
  }
  const prepared = prepareSignal(m.value, at);
  if ("reason" in prepared) return { kind, ...prepared };
  const request = { tenant, runId: prepared.runId, body: prepared.body, source: at, ...trace };
  return {
    kind,
    call: (api, cancelled) => api.signal(request, cancelled),
    derived: prepared.derived,
  };
}

const MAX_ISSUES = 5;

/**
 * The run and the `POST /v1/runs/{run_id}/signals` body of a signal message's
 * value, its `signal_id` `derivedId` when it has none (absent or null); or
 * why it can never be sent: not UTF-8 JSON (`bad-json`), or not the schema
 * of contracts/signals.ts `SignalMessage` (`validation`), judged here since
 * the run id is needed before there is anything to call.
 */
export function prepareSignal(
  value: Uint8Array,
  derivedId: string,
):
  | { runId: string; body: Uint8Array; derived: boolean }
  | { reason: "bad-json" | "validation"; detail: string } {
  let parsed: unknown;
  try {
    parsed = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(value));
  } catch (err) {
    const detail = err instanceof SyntaxError
      ? `the value is not JSON: ${err.message}`
      : "the value is not UTF-8";
    return { reason: "bad-json", detail };
  }
  const checked = SignalMessage.safeParse(parsed);
  if (!checked.success) {
    const issues = checked.error.issues.slice(0, MAX_ISSUES).map((i) =>
      `${formatPath(i.path) || "(body)"}: ${
        i.code === "unrecognized_keys" ? `unknown field(s) ${i.keys.join(", ")}` : i.message
      }`
    );
    return { reason: "validation", detail: `not a signal message: ${issues.join("; ")}` };
  }
  const { run_id, name, payload, signal_id } = checked.data;
  const body = { name, payload: payload ?? null, signal_id: signal_id ?? derivedId };
  return {
    runId: run_id,
    body: new TextEncoder().encode(JSON.stringify(body)),
    derived: signal_id == null,
  };
}
