/**
 * Starts a month's billing for CUSTOMERS customers (100 by default, one of
 * them closed), waits for it, and prints one JSON line: the month's
 * result. Exits 1 unless it succeeded.
 *
 *   POIMEN_TOKEN=<tenant token> deno task submit
 */
import { PoimenClient } from "@poimen/poimen/client";

function env(name: string, fallback?: string): string {
  const value = Deno.env.get(name) ?? fallback;
  if (value === undefined) throw new Error(`${name} is not set`);
  return value;
}

const poimen = new PoimenClient({
  url: env("API_URL", "http://127.0.0.1:8080"),
  token: env("POIMEN_TOKEN"),
});
const n = Number(env("CUSTOMERS", "100"));
const customers = Array.from({ length: n }, (_, i) => `cus-${i}`);
customers.push("closed-1");
const monthId = env("MONTH", new Date().toISOString().slice(0, 7));

// The month as its dispatch key: starting it twice is one run.
const { run } = await poimen.admitRun({
  workflow_ref: "billing.month@1",
  input: { month: monthId, customers },
  dispatch_key: `billing-month-${monthId}-${n}`,
});
const done = await poimen.waitForRun(run.run_id, { timeoutMs: 300_000 });
console.log(
  JSON.stringify({
    run_id: done.run_id,
    status: done.status,
    result: done.result,
  }),
);
Deno.exitCode = done.status === "succeeded" ? 0 : 1;
