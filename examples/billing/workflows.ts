/**
 * The billing team's workflows. Each `name@version` is immutable once a
 * worker registered it: to change an input or `maxAttempts`, add version 2
 * beside version 1 and keep hosting 1 until its runs are done.
 */
import { z } from "zod";
import { defineWorkflow } from "@poimen/poimen/workflow";

const Currency = z.enum(["EUR", "GBP", "USD"]);

// Sales tax per currency, in basis points (a stand-in for a real tax service).
const TAX_BPS: Record<z.infer<typeof Currency>, number> = { EUR: 2000, GBP: 2000, USD: 0 };

/** `billing.invoice@1`: issues one invoice and returns its id and total with tax. */
export const invoice = defineWorkflow({
  name: "billing.invoice",
  version: 1,
  input: z.object({
    customer_id: z.string().min(1),
    amount_cents: z.number().int().positive(),
    currency: Currency,
  }),
  maxAttempts: 5,
  handler(input, ctx) {
    const tax = Math.round((input.amount_cents * TAX_BPS[input.currency]) / 10_000);
    ctx.log.info("invoicing", { customer_id: input.customer_id, amount_cents: input.amount_cents });
    // Derived from the run, so a retried attempt issues the same invoice, not a second one.
    return Promise.resolve({
      invoice_id: `inv_${ctx.runId}`,
      total_cents: input.amount_cents + tax,
      currency: input.currency,
    });
  },
});

/**
 * `billing.refund@1`: refunds part or all of an invoice. The `.refine()` is
 * not JSON Schema, so the API admits a refund without its note; the worker's
 * parse then fails the run at once with code `invalid-input`.
 */
export const refund = defineWorkflow({
  name: "billing.refund",
  version: 1,
  input: z.object({
    invoice_id: z.string().startsWith("inv_"),
    amount_cents: z.number().int().positive(),
    reason: z.enum(["duplicate", "fraud", "other"]),
    note: z.string().max(500).optional(),
  }).refine((r) => r.reason !== "other" || (r.note ?? "").trim() !== "", {
    path: ["note"],
    message: "a refund for reason other needs a note",
  }),
  maxAttempts: 3,
  handler(input, ctx) {
    ctx.log.info("refunding", { invoice_id: input.invoice_id, amount_cents: input.amount_cents });
    return Promise.resolve({ refund_id: `ref_${ctx.runId}`, refunded_cents: input.amount_cents });
  },
});
