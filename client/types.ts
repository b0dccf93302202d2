/**
 * The wire types the client's users see (contracts/wire.ts): re-exported by
 * client/http.ts, kept here so that the client's own module holds code.
 *
 * @module
 */
export type {
  ChildFinishedPayload,
  ChildStartedPayload,
  RunAdmittedPayload,
  RunCancelledPayload,
  RunError,
  RunEventOf,
  RunEventPayloads,
  RunEventType,
  RunFailedPayload,
  RunReleasedPayload,
  RunRetryingPayload,
  RunStartedPayload,
  RunStep,
  RunSucceededPayload,
  RunWaitingPayload,
  RunWokenPayload,
  SignalReceipt,
  SignalReceivedPayload,
  SignalRequest,
  StepCompletedPayload,
  StepFailedPayload,
} from "../contracts/wire.ts";
