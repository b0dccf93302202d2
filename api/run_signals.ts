/**
 * `POST /v1/runs/{run_id}/signals`: a signal for a run of the caller's
 * tenant, stored in the run's mailbox once per (name, signal_id) and handed
 * to the first wait of that name (`ctx.waitForSignal`), however long before
 * the wait it arrived; a run waiting for it is woken in the same
 * transaction (db/signals.ts). 201 for a new signal, 200 with
 * `Idempotent-Replayed: true` for one seen before, 409 `run-finished` for
 * a final run, 404 for no such run (another tenant's included), 422 for a
 * payload that fails the schema the run's version declares for the signal
 * (`signals` of `defineWorkflow`, migration 023), naming the field. A
 * `signal_id` with the relay's prefix `kafka:` is a 422, unless a service
 * token sends it as its own `Poimen-Source`, as the inbox relay does for a
 * signal message without an id (as dispatch keys, api/runs.ts).
 */
import type { Context } from "hono";
import { PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { UUID_PATTERN } from "../core/uuid.ts";
import type { Sql } from "../db/pool.ts";
import type { Admission } from "../admission/admit.ts";
import { sendSignal } from "../db/signals.ts";
import { notifyChannels, OUTBOX_CHANNEL, QUEUE_CHANNEL } from "../db/notify.ts";
import { HEADERS } from "../contracts/runs.ts";
import { RELAY_SIGNAL_ID_PREFIX, SignalReceipt, SignalRequest } from "../contracts/signals.ts";
import type { ApiEnv } from "./app.ts";
import type { ApiMetrics } from "./metrics.ts";
import { parseJsonBody, parseWith } from "./request.ts";

/** What the signal route needs. */
export interface SignalDeps {
  sql: Sql;
  /** Checks a payload against the schema the run's version declares for its signal. */
  admission: Pick<Admission, "signalProblems">;
  metrics: ApiMetrics;
  log: Logger;
  /** The body's read timeout (BODY_READ_TIMEOUT_MS). */
  readTimeoutMs?: number;
}

/** Answers `POST /v1/runs/{run_id}/signals`; see the module comment. */
export async function answerSignal(deps: SignalDeps, c: Context<ApiEnv>): Promise<Response> {
  const runId = c.req.param("run_id") ?? "";
  const tenantId = c.get("principal").tenantId;
  const body = parseWith(SignalRequest, await parseJsonBody(c, deps.readTimeoutMs));
  refuseReservedId(body.signal_id, c);
  // Not a uuid cannot be anyone's run: 404, as for GET.
  if (!UUID_PATTERN.test(runId)) throw new PoimenError("not-found", `no run ${runId}`);
  // Without an id, each call is a new signal (as a run without a dispatch key).
  const signalId = body.signal_id ?? crypto.randomUUID();
  const payload = body.payload ?? null;
  const sent = await sendSignal(deps.sql, tenantId, runId, {
    name: body.name,
    signal_id: signalId,
    payload,
  }, (run) => {
    const errors = deps.admission.signalProblems(tenantId, run, body.name, payload);
    if (errors) {
      const of = `${run.workflow_name}@${run.workflow_version}`;
      throw new PoimenError("validation", `signal ${body.name}: payload does not match ${of}`, {
        errors,
      });
    }
  });
  if (sent.outcome === "no-run") throw new PoimenError("not-found", `no run ${runId}`);
  if (sent.outcome === "final") {
    deps.metrics.signals.inc({ outcome: "refused" });
    throw new PoimenError("run-finished", `run ${runId} already ${sent.status}`, {
      extensions: { run_status: sent.status },
    });
  }
  const created = sent.outcome === "created";
  deps.metrics.signals.inc({ outcome: sent.woken ? "woke" : sent.outcome });
  if (created) {
    // After the commit, as every wake-up: the outbox ships signal.received
    // (and run.woken); a woken run is due, so the workers claim it now.
    await notifyChannels(deps.sql, sent.woken ? [QUEUE_CHANNEL, OUTBOX_CHANNEL] : [OUTBOX_CHANNEL])
      .catch((error) =>
        deps.log.warn("signal notify failed", { tenant: tenantId, run_id: runId, error })
      );
  }
  const receipt: SignalReceipt = {
    run_id: runId,
    name: sent.signal.name,
    signal_id: sent.signal.signal_id,
    received_at: new Date(sent.signal.received_at).toISOString(),
    consumed_by: sent.signal.consumed_as,
    run_status: sent.status,
  };
  if (created) return c.json(receipt, 201);
  c.header(HEADERS.replayed, "true");
  return c.json(receipt, 200);
}

/**
 * Refuses a signal id in the relay's reserved namespace unless a service
 * token sends it as the id of its own `Poimen-Source`: no caller can take
 * the id of a signal message not yet relayed, which would make that message
 * a replay of the caller's signal.
 */
function refuseReservedId(id: string | null | undefined, c: Context<ApiEnv>): void {
  if (id == null || !id.startsWith(RELAY_SIGNAL_ID_PREFIX)) return;
  const principal = c.get("principal");
  if (principal.kind === "service" && c.req.header(HEADERS.source) === id) return;
  throw new PoimenError("validation", "the request does not match the schema", {
    errors: [{
      path: "signal_id",
      message:
        `the prefix ${RELAY_SIGNAL_ID_PREFIX} is reserved for the ids the inbox relay derives`,
    }],
  });
}
