/**
 * A fan-out and fan-in, as durable runs: a month's billing run starts one
 * child run per customer (`ctx.map`: each child once, however often the
 * parent's worker dies), waits for all of them without holding a worker
 * slot, and sums their totals. A customer whose invoice fails is reported,
 * not fatal: the month catches the `ChildRunFailed` of a lone retry.
 */
import { z } from "zod";
import { ChildRunFailed, defineWorkflow } from "@poimen/poimen/workflow";

// A stand-in for the ledger: a customer's total for the month, in cents.
function totalOf(customerId: string, month: string): number {
  let h = 0;
  for (const ch of `${customerId}/${month}`) {
    h = (h * 31 + ch.charCodeAt(0)) % 100_000;
  }
  return 1_000 + h;
}

/** `billing.customer-month@1`: one customer's invoice for the month (a child). */
export const customerMonth = defineWorkflow({
  name: "billing.customer-month",
  version: 1,
  input: z.object({
    customer_id: z.string().min(1).max(100),
    month: z.string(),
  }),
  output: z.object({ customer_id: z.string(), cents: z.number().int() }),
  maxAttempts: 3,
  async handler(input, ctx) {
    if (input.customer_id.startsWith("closed-")) {
      throw new Error(`customer ${input.customer_id} is closed`);
    }
    const cents = await ctx.step(
      "total",
      () => totalOf(input.customer_id, input.month),
    );
    return { customer_id: input.customer_id, cents };
  },
});

/** `billing.month@1`: every customer's invoice (children, at most 20 at once), then the sum. */
export const month = defineWorkflow({
  name: "billing.month",
  version: 1,
  input: z.object({
    month: z.string().regex(/^\d{4}-\d{2}$/),
    customers: z.array(z.string().min(1).max(100)).max(10_000),
  }),
  maxAttempts: 5,
  async handler(input, ctx) {
    const open = input.customers.filter((c) => !c.startsWith("closed-"));
    // One child per customer, named `invoices#c<i>`, outputs in input order.
    const invoices = await ctx.map(
      "invoices",
      customerMonth,
      open.map((customer_id) => ({ customer_id, month: input.month })),
      { concurrency: 20 },
    );
    // One more child, waited for alone: a closed customer's, which fails.
    const closed = input.customers.find((c) => c.startsWith("closed-"));
    let failed: string | null = null;
    if (closed) {
      const child = await ctx.start("closed", customerMonth, {
        customer_id: closed,
        month: input.month,
      });
      try {
        await child.result();
      } catch (err) {
        if (!(err instanceof ChildRunFailed)) throw err;
        failed = err.message;
      }
    }
    return {
      month: input.month,
      customers: invoices.length,
      cents: invoices.reduce((sum, i) => sum + i.cents, 0),
      failed,
    };
  },
});
