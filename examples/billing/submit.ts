/**
 * Asks for billing runs both ways poimen admits them: an invoice over HTTP
 * with the client typed by the definitions, then a refund of it as a Kafka
 * dispatch message (the inbox relay turns it into the same `POST /v1/runs`).
 * Prints each run once finished, one JSON line each; exits 1 unless both
 * succeeded. It imports the definitions only: no handler, nothing the
 * worker needs.
 *
 *   POIMEN_TOKEN=<tenant token> POIMEN_TENANT=<tenant> deno task submit
 */
import { PoimenClient, PoimenRunError, type WorkflowInput } from "@poimen/poimen/client";
import { DispatchPublisher } from "@poimen/poimen/dispatch";
import { invoice, refund } from "./definitions.ts";

function env(name: string, fallback?: string): string {
  const value = Deno.env.get(name) ?? fallback;
  if (value === undefined) throw new Error(`${name} is not set`);
  return value;
}

const tenant = env("POIMEN_TENANT");
const poimen = new PoimenClient({
  url: env("API_URL", "http://127.0.0.1:8080"),
  token: env("POIMEN_TOKEN"),
});
const WAIT_MS = 60_000;

/** Calls `check` every 250 ms until it gives a value; throws after `timeoutMs`. */
async function poll<T>(what: string, check: () => Promise<T | undefined>, timeoutMs = WAIT_MS) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

/** One JSON line per run; a run that did not succeed is printed with its error. */
async function report<T>(via: string, runId: string, result: Promise<T>): Promise<T | undefined> {
  try {
    const value = await result;
    console.log(JSON.stringify({ via, run_id: runId, status: "succeeded", result: value }));
    return value;
  } catch (err) {
    if (!(err instanceof PoimenRunError)) throw err;
    const { status, error } = err.run;
    console.log(JSON.stringify({ via, run_id: runId, status, error }));
    return undefined;
  }
}

// Over HTTP. `start` takes only what invoice's input schema does (a wrong
// field does not compile), pins billing.invoice@1, and sends one generated
// dispatch key with every attempt, so its retries never make a second run.
const started = await poimen.start(invoice, {
  customer_id: "cus_42",
  amount_cents: 12_500,
  currency: "EUR",
});
// Typed by invoice's output schema, which the worker checked.
const invoiced = await report(
  "http",
  started.runId,
  poimen.result(started, { timeoutMs: WAIT_MS }),
);

let ok = invoiced !== undefined;
if (invoiced) {
  // Over Kafka. Our own dispatch_key names the refund: publishing it again
  // (say, after a crash before the broker's answer) still makes one run.
  const dispatchKey = `refund-${invoiced.invoice_id}`;
  const input: WorkflowInput<typeof refund> = {
    invoice_id: invoiced.invoice_id,
    amount_cents: invoiced.total_cents,
    reason: "duplicate",
  };
  {
    await using publisher = new DispatchPublisher({
      brokers: env("KAFKA_BROKERS", "127.0.0.1:9092").split(","),
    });
    await publisher.publish(tenant, {
      workflow_ref: `${refund.name}@${refund.version}`,
      input,
      dispatch_key: dispatchKey,
    });
  }
  // The relay admits it in its own time: find the run by its key.
  const relayed = await poll(`the run of dispatch key ${dispatchKey}`, async () => {
    for await (const page of poimen.listRuns({ dispatch_key: dispatchKey })) return page.runs[0];
  });
  const refunded = await report(
    "kafka",
    relayed.run_id,
    poimen.result(refund, relayed.run_id, { timeoutMs: WAIT_MS }),
  );
  ok = refunded !== undefined;
}
Deno.exitCode = ok ? 0 : 1;
