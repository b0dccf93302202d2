/**
 * Places an order and approves it: admits `shop.order@1`, waits until the
 * run waits for its approval (charged, suspended), sends the approval signal
 * (with the client's `signal`; `curl` would do as well), then waits
 * for the run to ship. Prints one JSON line per stage; exits 1 unless the
 * order shipped.
 *
 *   POIMEN_TOKEN=<tenant token> deno task submit
 */
import { PoimenClient, type Run } from "@poimen/poimen/client";

function env(name: string, fallback?: string): string {
  const value = Deno.env.get(name) ?? fallback;
  if (value === undefined) throw new Error(`${name} is not set`);
  return value;
}

const poimen = new PoimenClient({
  url: env("API_URL", "http://127.0.0.1:8080"),
  token: env("POIMEN_TOKEN"),
});
const orderId = env("ORDER_ID", `order-${crypto.randomUUID().slice(0, 8)}`);

/** Calls `check` every 250 ms until it gives a value; throws after `timeoutMs`. */
async function poll<T>(
  what: string,
  check: () => Promise<T | undefined>,
  timeoutMs = 60_000,
) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

function say(stage: string, run: Run) {
  const { run_id, status, waiting_for, result } = run;
  const steps = run.steps?.map((s) => `${s.name}:${s.status}`);
  console.log(
    JSON.stringify({ stage, run_id, status, waiting_for, steps, result }),
  );
}

// The order's id as its dispatch key: placing it twice is one run.
const { run } = await poimen.admitRun({
  workflow_ref: "shop.order@1",
  input: {
    order_id: orderId,
    amount_cents: 4_200,
    cool_off_ms: Number(env("COOL_OFF_MS", "6000")),
  },
  dispatch_key: orderId,
});
say("placed", run);

// Charged, and suspended until someone approves.
const waiting = await poll("the approval wait", async () => {
  const r = await poimen.getRun(run.run_id);
  return r.status === "waiting" && r.waiting_for?.reason === "signal" ? r : undefined;
});
say("awaiting approval", waiting);

// The approval, with an id of its own: sending it again is one signal.
await poimen.signal(run.run_id, {
  name: "approval",
  payload: { approved: true, by: "alice" },
  signal_id: `approval-${orderId}`,
});

const done = await poimen.waitForRun(run.run_id, { timeoutMs: 120_000 });
say("finished", done);
Deno.exitCode = done.status === "succeeded" &&
    (done.result as { status?: string } | null)?.status === "shipped"
  ? 0
  : 1;
