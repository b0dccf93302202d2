/**
 * The wire contract of signals, as zod schemas: the `POST
 * /v1/runs/{run_id}/signals` body and its answer. The API validates with
 * them and the OpenAPI document is generated from them; contracts/wire.ts
 * holds the same shapes as plain types for the clients. Depends on zod alone.
 */
import { z } from "zod";
import type * as Wire from "./wire.ts";
import { JsonValue } from "./json_value.ts";
import { RELAY_KEY_PREFIX, RunStatus } from "./runs.ts";

/**
 * A signal's name, the name of the wait that takes it (`ctx.waitForSignal`):
 * 1-200 characters, without `#` (a wait's step name gets `#2`… when the
 * name is waited for again) or control characters.
 */
export const SIGNAL_NAME_PATTERN: RegExp = /^[^#\p{Cc}]{1,200}$/u;

const PRINTABLE = /^[^\p{Cc}\p{Cs}]+$/u;

/** `POST /v1/runs/{run_id}/signals`. */
export const SignalRequest = z.strictObject({
  name: z.string().regex(SIGNAL_NAME_PATTERN, "1-200 characters, without # or control characters")
    .describe("The signal's name: what `ctx.waitForSignal(name)` waits for"),
  payload: JsonValue.optional().describe("Any JSON; null when absent"),
  signal_id: z.string().min(1).max(255).regex(PRINTABLE, "printable characters only").nullable()
    .optional().describe(
      "The signal's identity: the same (run, name, signal_id) is one signal, and sending it " +
        "again is a replay (200). 1-255 printable characters; absent: each call a new signal. " +
        "The prefix `kafka:` is reserved to the inbox relay",
    ),
});
export type SignalRequest = z.infer<typeof SignalRequest>;

/**
 * The prefix of the signal ids the inbox relay derives for a signal message
 * without one (`kafka:<topic>/<partition>/<offset>`, its `Poimen-Source`
 * too). Reserved as dispatch keys are (contracts/runs.ts `RELAY_KEY_PREFIX`,
 * the same prefix): only a service token may send one, and only the id equal
 * to its request's `Poimen-Source`, so no caller can take the id of a message
 * not yet relayed and have that message replay the caller's signal.
 */
export const RELAY_SIGNAL_ID_PREFIX: string = RELAY_KEY_PREFIX;

/**
 * A message of `poimen.<tenant>.signals` (keyed `<tenant>/<run_id>`): the
 * run, and the `POST /v1/runs/{run_id}/signals` body the relay sends.
 */
export const SignalMessage = SignalRequest.extend({
  run_id: z.uuid().describe("The run the signal is for"),
});
export type SignalMessage = z.infer<typeof SignalMessage>;

/** A signal as the run's mailbox holds it: the answer to a signal. */
export const SignalReceipt = z.object({
  run_id: z.uuid(),
  name: z.string(),
  signal_id: z.string().describe("The sender's, or one the API made"),
  received_at: z.string().describe("When the API stored it"),
  consumed_by: z.string().nullable().describe(
    "The wait (its step name) that consumed it; null while it waits for one",
  ),
  run_status: RunStatus.describe("The run's status after this call (`queued` when it woke it)"),
});
export type SignalReceipt = z.infer<typeof SignalReceipt>;

// The plain types of wire.ts and the schemas above describe the same shapes.
type Same<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true
  : false;
const sameShapes: [
  Same<SignalRequest, Wire.SignalRequest>,
  Same<SignalReceipt, Wire.SignalReceipt>,
  Same<SignalMessage, Wire.SignalMessage>,
] = [true, true, true];
void sameShapes;
