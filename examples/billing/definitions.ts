/**
 * The billing team's workflows as their callers see them: names, versions,
 * inputs and results, and no handler. `submit.ts` (and any service that
 * starts billing runs) imports this file alone, so it never loads what the
 * handlers need; `worker.ts` implements these definitions.
 *
 * Each `name@version` is immutable once a worker registered it: to change
 * an input, an output or `maxAttempts`, add version 2 beside version 1 and
 * keep hosting 1 until its runs are done.
 */
import { z } from "zod";
import { defineWorkflow } from "@poimen/poimen/workflow";

/** The currencies billing invoices in. */
export const Currency = z.enum(["EUR", "GBP", "USD"]);

/** `billing.invoice@1`: issues one invoice and returns its id and total with tax. */
export const invoice = defineWorkflow({
  name: "billing.invoice",
  version: 1,
  input: z.object({
    customer_id: z.string().min(1),
    amount_cents: z.number().int().positive(),
    currency: Currency,
  }),
  output: z.object({
    invoice_id: z.string().startsWith("inv_"),
    total_cents: z.number().int().positive(),
    currency: Currency,
  }),
  maxAttempts: 5,
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
  output: z.object({ refund_id: z.string(), refunded_cents: z.number().int().positive() }),
  maxAttempts: 3,
});
