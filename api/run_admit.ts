/**
 * What a single admission and a batch's items share: where a request came
 * from, the reserved dispatch-key namespace, and admission behind the
 * tenant's quota gate. Whatever admits a run over HTTP goes through here,
 * so that a batch item is admitted exactly as a single request.
 */
import type { Context } from "hono";
import { PoimenError } from "../core/errors.ts";
import { activeTraceparent, validTraceparent } from "../core/tracing.ts";
import type { Admission, AdmitResult } from "../admission/admit.ts";
import type { QuotaGate } from "../admission/quota.ts";
import {
  CHILD_KEY_PREFIX,
  HEADERS,
  RELAY_KEY_PREFIX,
  type Run,
  type RunRequest,
  SourceHeader,
} from "../contracts/runs.ts";
import { SCHEDULE_KEY_PREFIX } from "../admission/schedule_ticker.ts";
import type { ApiEnv } from "./app.ts";
import type { Principal } from "./auth.ts";
import { parseWith } from "./request.ts";

/** Who admits, from where, with which trace: the same for every item of a request. */
export interface AdmitCaller {
  principal: Principal;
  /** `http:<token name>`, or the `Poimen-Source` a service token sent. */
  source: string;
  traceparent?: string;
}

/**
 * The caller of an admission request: its principal, its source (only a
 * service token, the relay, may say where a request came from) and the
 * trace its run is stored with.
 */
export function admitCaller(c: Context<ApiEnv>): AdmitCaller {
  const principal = c.get("principal");
  const claimed = principal.kind === "service" ? c.req.header(HEADERS.source) : undefined;
  const source = claimed === undefined
    ? `http:${principal.name}`
    : parseWith(SourceHeader, claimed, `header.${HEADERS.source}`);
  return {
    principal,
    source,
    // The API's request span when tracing is on, else the caller's trace.
    traceparent: activeTraceparent() ?? validTraceparent(c.req.header("traceparent")),
  };
}

/**
 * Refuses a dispatch key in a reserved namespace: the relay's (`kafka:`, see
 * `RELAY_KEY_PREFIX`) unless a service token sends it as the key of its own
 * `Poimen-Source`, as the relay does for a keyless message; child runs'
 * (`child:`, `CHILD_KEY_PREFIX`) and schedules' occurrences (`schedule:`,
 * `SCHEDULE_KEY_PREFIX`) always, from any caller: only a worker and the
 * schedule ticker derive those, and a caller taking one's key would turn
 * that admission into a silent replay. 422 naming the field the key came
 * from.
 */
export function refuseReservedKey(
  body: RunRequest,
  fromHeader: boolean,
  caller: AdmitCaller,
): void {
  const key = body.dispatch_key;
  const path = fromHeader ? `header.${HEADERS.idempotencyKey}` : "dispatch_key";
  for (
    const [prefix, whose] of [
      [CHILD_KEY_PREFIX, "the keys of child runs"],
      [SCHEDULE_KEY_PREFIX, "the occurrences of schedules"],
    ]
  ) {
    if (!key?.startsWith(prefix)) continue;
    throw new PoimenError("validation", "the request does not match the schema", {
      errors: [{ path, message: `the prefix ${prefix} is reserved for ${whose}` }],
    });
  }
  if (key == null || !key.startsWith(RELAY_KEY_PREFIX)) return;
  if (caller.principal.kind === "service" && key === caller.source) return;
  throw new PoimenError("validation", "the request does not match the schema", {
    errors: [{
      path,
      message: `the prefix ${RELAY_KEY_PREFIX} is reserved for the keys the inbox relay derives`,
    }],
  });
}

/**
 * Admits `body` for `caller`: over the tenant's quota, a 429 before the run
 * reaches the kernel's batcher, nothing written. `before`, when given, is
 * awaited after the quota check and before the kernel: a batch item waits
 * there for an earlier item with its dispatch key, as if sent after it.
 */
export function admitChecked(
  deps: { admission: Admission; quota?: QuotaGate },
  caller: AdmitCaller,
  body: RunRequest,
  before?: Promise<unknown>,
): Promise<AdmitResult> {
  const tenantId = caller.principal.tenantId;
  const admit = async () => {
    if (before) await before;
    return await deps.admission.admit(body, {
      tenantId,
      source: caller.source,
      entry: "http",
      traceparent: caller.traceparent,
    });
  };
  return deps.quota ? deps.quota.admit(tenantId, admit) : admit();
}

/** The admission metric's outcome of an admitted request. */
export function admissionOutcome(r: AdmitResult): "created" | "deduplicated" | "debounced" {
  return r.created ? "created" : r.debounced ? "debounced" : "deduplicated";
}

/**
 * `run` as an admission answers it: with `debounced` when the workflow is
 * debounced and the request made or joined the run (not on a replay).
 */
export function debouncedRun(r: AdmitResult, run: Run): Run {
  return r.debounced === undefined ? run : { ...run, debounced: r.debounced };
}
