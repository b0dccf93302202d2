/**
 * Asks for billing runs both ways poimen admits them: an invoice over HTTP
 * with the typed client, then a refund of it as a Kafka dispatch message
 * (the inbox relay turns it into the same `POST /v1/runs`). Prints each run
 * once finished, one JSON line each; exits 1 unless both succeeded.
 *
 *   POIMEN_TOKEN=<tenant token> POIMEN_TENANT=<tenant> deno task submit
 */
import { PoimenClient, type Run } from "@poimen/poimen/client";
import { DispatchPublisher } from "@poimen/poimen/dispatch";

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

/** Calls `check` every 250 ms until it gives a value; throws after `timeoutMs`. */
async function poll<T>(what: string, check: () => Promise<T | undefined>, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

const finished = (id: string) =>
  poll(`run ${id}`, async () => {
    const run = await poimen.getRun(id);
    return run.status === "queued" || run.status === "running" ? undefined : run;
  });

function report(via: string, run: Run): boolean {
  const { run_id, workflow, workflow_version, status, result, error } = run;
  console.log(JSON.stringify({ via, run_id, workflow, workflow_version, status, result, error }));
  return status === "succeeded";
}

// Over HTTP. `idempotent` makes the client send one generated dispatch_key
// with every attempt, so its retries (network errors, 5xx) never make a second run.
const { run: admitted } = await poimen.admitRun({
  workflow_ref: "billing.invoice@1",
  input: { customer_id: "cus_42", amount_cents: 12_500, currency: "EUR" },
}, { idempotent: true });
const invoiced = await finished(admitted.run_id);
let ok = report("http", invoiced);

if (ok) {
  // Over Kafka. Our own dispatch_key names the refund: publishing it again
  // (say, after a crash before the broker's answer) still makes one run.
  const { invoice_id, total_cents } = invoiced.result as {
    invoice_id: string;
    total_cents: number;
  };
  const dispatchKey = `refund-${invoice_id}`;
  {
    await using publisher = new DispatchPublisher({
      brokers: env("KAFKA_BROKERS", "127.0.0.1:9092").split(","),
    });
    await publisher.publish(tenant, {
      workflow_ref: "billing.refund@1",
      input: { invoice_id, amount_cents: total_cents, reason: "duplicate" },
      dispatch_key: dispatchKey,
    });
  }
  // The relay admits it in its own time: find the run by its key.
  const relayed = await poll(`the run of dispatch key ${dispatchKey}`, async () => {
    for await (const page of poimen.listRuns({ dispatch_key: dispatchKey })) return page.runs[0];
  });
  ok = report("kafka", await finished(relayed.run_id));
}
Deno.exitCode = ok ? 0 : 1;
