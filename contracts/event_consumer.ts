/**
 * What a consumer of `poimen.<tenant>.events` needs: the message's type, a
 * union discriminated by the event `type` (each type's payload typed), its
 * headers, and a strict parser. The package's `./events` entry point.
 *
 * Delivery is at least once and in seq order per run: dedupe by
 * `(run_id, seq)`. A consumer should skip a `type` it does not know (a
 * later version may add one): `parseEventMessage` refuses it, so parse
 * inside a `try`, or read the `poimen-type` header first.
 *
 * ```ts
 * import { parseEventMessage, RUN_EVENT_TYPES } from "@poimen/poimen/events";
 *
 * const type = message.headers["poimen-type"];
 * if ((RUN_EVENT_TYPES as readonly string[]).includes(type)) {
 *   const event = parseEventMessage(message.value);
 *   if (event.type === "run.succeeded") console.log(event.run_id, event.payload.result);
 * }
 * ```
 *
 * @module
 */
export type {
  ChildFinishedPayload,
  ChildStartedPayload,
  EventMessage,
  EventMessageOf,
  RunAdmittedPayload,
  RunCancelledPayload,
  RunError,
  RunEventBody,
  RunEventPayloads,
  RunEventType,
  RunFailedPayload,
  RunReleasedPayload,
  RunRetryingPayload,
  RunStartedPayload,
  RunSucceededPayload,
  RunWaitingPayload,
  RunWokenPayload,
  SignalReceivedPayload,
  StepCompletedPayload,
  StepFailedPayload,
  TypedPayload,
} from "./event_types.ts";
export { FINAL_EVENT_TYPES, RUN_EVENT_TYPES } from "./event_types.ts";
export { EVENT_HEADERS, parseEventMessage } from "./events.ts";
