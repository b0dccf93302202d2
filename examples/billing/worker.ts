/**
 * The billing worker: implements the definitions (definitions.ts) and hosts
 * them until SIGTERM or SIGINT. Configured by the environment, as
 * `deno task worker` of poimen is (DATABASE_URL, WORKER_CONCURRENCY,
 * WORKER_METRICS_PORT, …).
 *
 *   DATABASE_URL=postgres://… deno task worker
 *
 * The handlers' dependencies (here only a tax table; in a real team a
 * payment SDK, a database client) are imported here, never by callers.
 * Imported as a module (`deno task worker --workflows worker.ts` of the
 * poimen checkout) it only exports the implementations.
 */
import type { z } from "zod";
import { runWorker } from "@poimen/poimen/worker";
import { implement } from "@poimen/poimen/workflow";
import { type Currency, invoice, refund } from "./definitions.ts";

// Sales tax per currency, in basis points (a stand-in for a real tax service).
const TAX_BPS: Record<z.infer<typeof Currency>, number> = { EUR: 2000, GBP: 2000, USD: 0 };

/** `billing.invoice@1`'s handler: its input and result are typed by the definition. */
export const invoiceWorkflow = implement(invoice, (input, ctx) => {
  const tax = Math.round((input.amount_cents * TAX_BPS[input.currency]) / 10_000);
  ctx.log.info("invoicing", { customer_id: input.customer_id, amount_cents: input.amount_cents });
  // Derived from the run, so a retried attempt issues the same invoice, not a second one.
  return {
    invoice_id: `inv_${ctx.runId}`,
    total_cents: input.amount_cents + tax,
    currency: input.currency,
  };
});

/** `billing.refund@1`'s handler. */
export const refundWorkflow = implement(refund, (input, ctx) => {
  ctx.log.info("refunding", { invoice_id: input.invoice_id, amount_cents: input.amount_cents });
  return { refund_id: `ref_${ctx.runId}`, refunded_cents: input.amount_cents };
});

if (import.meta.main) {
  // 0 after a graceful stop, 2 for a bad configuration; the process's to set.
  Deno.exitCode = await runWorker({ workflows: [invoiceWorkflow, refundWorkflow] });
}
