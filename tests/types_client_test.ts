/**
 * The types of the split a team makes (examples/billing: definitions.ts,
 * worker.ts) and of the typed client, held by the type checker: every
 * `@ts-expect-error` below must be an error, so a change that lets a wrong
 * input or a wrong use of a result compile (an `any` creeping in, a
 * definition losing its types) fails `deno test`'s type check of this file.
 * The functions are never called: the compiler is the test. The runtime
 * checks beside them are what the types promise of the values.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import {
  PoimenClient,
  type RunHandle,
  type WorkflowInput,
  type WorkflowResult,
} from "@poimen/poimen/client";
import {
  ChildRunFailed,
  defineWorkflow,
  type DurableContext,
  implement,
  isWorkflow,
  isWorkflowDefinition,
  type WorkflowDefinition,
} from "@poimen/poimen/workflow";
import { createWorker } from "@poimen/poimen/worker";
import { invoice, refund } from "../examples/billing/definitions.ts";
import { invoiceWorkflow, refundWorkflow } from "../examples/billing/worker.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true
  : false;
function same<A, B>(_proof: Equal<A, B>): void {}

// The client: start, result and run, typed by a definition.
async function _client(poimen: PoimenClient) {
  const handle = await poimen.start(invoice, {
    customer_id: "cus_1",
    amount_cents: 100,
    currency: "EUR",
  });
  same<
    typeof handle,
    RunHandle<{ invoice_id: string; total_cents: number; currency: "EUR" | "GBP" | "USD" }>
  >(true);
  const result = await poimen.result(handle);
  same<typeof result.total_cents, number>(true);
  // @ts-expect-error: the result has no such field
  result.total;
  // @ts-expect-error: total_cents is a number, not a string
  result.total_cents.toUpperCase();

  // @ts-expect-error: amount_cents must be a number
  await poimen.start(invoice, { customer_id: "cus_1", amount_cents: "100", currency: "EUR" });
  // @ts-expect-error: currency is one of EUR, GBP, USD
  await poimen.start(invoice, { customer_id: "cus_1", amount_cents: 100, currency: "JPY" });
  // @ts-expect-error: customer_id is required
  await poimen.start(invoice, { amount_cents: 100, currency: "EUR" });
  // @ts-expect-error: an invoice's input is not a refund's
  await poimen.run(invoice, { invoice_id: "inv_1", amount_cents: 1, reason: "fraud" });

  const refunded = await poimen.run(refund, {
    invoice_id: "inv_1",
    amount_cents: 1,
    reason: "fraud",
  });
  same<typeof refunded, { refund_id: string; refunded_cents: number }>(true);
  // @ts-expect-error: a refund's result has no invoice_id
  refunded.invoice_id;

  // A result by definition and run id is typed by the definition too.
  const again = await poimen.result(refund, "0190c9c2-0000-7000-8000-000000000000");
  // @ts-expect-error: refunded_cents is a number
  again.refunded_cents.length;

  // A workflow without an output schema gives an unknown result: it must be narrowed.
  const echo = defineWorkflow({ name: "echo", version: 1, input: z.unknown() });
  const echoed = await poimen.run(echo, { anything: true });
  same<typeof echoed, unknown>(true);
  // @ts-expect-error: unknown until narrowed
  echoed.anything;
}

// The definitions and their implementations.
function _definitions() {
  same<WorkflowInput<typeof invoice>["currency"], "EUR" | "GBP" | "USD">(true);
  same<WorkflowResult<typeof refund>["refunded_cents"], number>(true);
  // An implementation is a definition of the same types: a producer may take either.
  const asDefinition: WorkflowDefinition<unknown, WorkflowResult<typeof invoice>> = invoiceWorkflow;
  void asDefinition;

  // @ts-expect-error: the handler must return the output's shape
  implement(invoice, () => ({ invoice_id: "inv_1", total_cents: "12", currency: "EUR" }));
  // @ts-expect-error: the handler's input has no such field
  implement(refund, (input) => ({ refund_id: input.refund_id, refunded_cents: 1 }));
  // @ts-expect-error: a one-call definition's handler is held to its output too
  defineWorkflow({
    name: "t",
    version: 1,
    input: z.object({ n: z.number() }),
    output: z.object({ doubled: z.number() }),
    handler: (input) => ({ doubled: String(input.n * 2) }),
  });

  // @ts-expect-error: a worker hosts implementations, not bare definitions
  createWorker({ workflows: [invoice], databaseUrl: "postgres://nowhere" });
}
// Children: result() and ctx.map typed by the child's definition.
async function _children(ctx: DurableContext) {
  const input = { customer_id: "cus_1", amount_cents: 100, currency: "EUR" as const };
  const child = await ctx.start("inv", invoice, input);
  const out = await child.result();
  same<typeof out, WorkflowResult<typeof invoice>>(true);
  // @ts-expect-error: an invoice's result has no refunded_cents
  out.refunded_cents;
  const all = await ctx.map("invs", invoice, [input, input], { failFast: true });
  same<typeof all, WorkflowResult<typeof invoice>[]>(true);
  // @ts-expect-error: each input is the child's input
  await ctx.map("bad", invoice, [{ refund_id: "r" }]);
  // @ts-expect-error: failFast is a boolean
  await ctx.map("opt", invoice, [input], { failFast: "yes" });
  await ctx.map("bounded", invoice, [input], { concurrency: 10, priority: 1 });
  // @ts-expect-error: concurrency is a number
  await ctx.map("opt2", invoice, [input], { concurrency: "10" });
}
void _client;
void _definitions;
void _children;

Deno.test("types: a definition has no handler, its implementation is the definition with one; a worker refuses a bare definition", () => {
  assert.equal(isWorkflowDefinition(invoice), true);
  assert.equal(isWorkflow(invoice), false);
  assert.equal("handler" in invoice, false);
  assert.equal(isWorkflow(invoiceWorkflow), true);
  assert.equal(invoiceWorkflow.name, invoice.name);
  assert.equal(invoiceWorkflow.outputSchema, invoice.outputSchema);
  assert.deepEqual(new WorkflowRegistry([invoiceWorkflow, refundWorkflow]).list(), [
    "billing.invoice@1",
    "billing.refund@1",
  ]);
  assert.throws(
    () => new WorkflowRegistry([invoice as never]),
    /billing\.invoice@1 is a definition without a handler/,
  );
  assert.throws(() => implement({ name: "x", version: 1 } as never, () => 1), /defineWorkflow/);
  assert.throws(() => implement(invoice, "no" as never), /billing\.invoice@1: handler must be/);
  const failed = new ChildRunFailed({
    runId: "r",
    name: "m#c2",
    workflow: "billing.invoice@1",
    status: "failed",
    error: { message: "no", code: "declined" },
    index: 2,
  });
  assert.ok(failed instanceof Error);
  assert.equal(failed.code, "declined");
  assert.equal(failed.message, "child m#c2 (run r of billing.invoice@1) failed (declined): no");
});
