/**
 * An order, as a durable run: charge the card (a step: never twice, however
 * often the worker dies), wait for a person's approval (a signal, with a
 * timeout), let the order cool off (a sleep: the run is suspended, no
 * worker holds it), then ship (a step). Each durable call has a name; keep
 * their order when you change the code, or give the change a new version.
 */
import { z } from "zod";
import { defineWorkflow } from "@poimen/poimen/workflow";

const HOUR = 3_600_000;

/** What the approver sends: `POST /v1/runs/{id}/signals` `{"name":"approval","payload":…}`. */
export interface Approval {
  approved: boolean;
  by?: string;
}

// Stand-ins for a payment provider and a carrier. Each takes the step's key,
// the same on every attempt, as its idempotency key (Stripe's
// Idempotency-Key): the other side charges or ships once per key.
function charge(orderId: string, cents: number, key: string) {
  return { charge_id: `ch_${key.slice(-12)}`, order_id: orderId, cents };
}
function refund(chargeId: string, key: string) {
  return { refund_id: `re_${key.slice(-12)}`, charge_id: chargeId };
}
function ship(orderId: string, key: string) {
  return { shipment_id: `sh_${key.slice(-12)}`, order_id: orderId };
}

/** `shop.order@1`: charge, wait for approval, cool off, ship (or refund when not approved). */
export const order = defineWorkflow({
  name: "shop.order",
  version: 1,
  input: z.object({
    order_id: z.string().min(1).max(100),
    amount_cents: z.number().int().positive(),
    /** How long to wait for the approval before refunding. */
    approval_timeout_ms: z.number().int().min(0).max(7 * 24 * HOUR).default(
      24 * HOUR,
    ),
    /** The cool-off between approval and shipping (over 5 s: the run is suspended). */
    cool_off_ms: z.number().int().min(0).max(24 * HOUR).default(HOUR),
  }),
  maxAttempts: 5,
  async handler(input, ctx) {
    const charged = await ctx.step(
      "charge",
      () => charge(input.order_id, input.amount_cents, ctx.stepKey),
      { retries: 2 },
    );
    const approval = await ctx.waitForSignal<Approval>("approval", {
      timeout: input.approval_timeout_ms,
    });
    if (!approval?.payload.approved) {
      const refunded = await ctx.step(
        "refund",
        () => refund(charged.charge_id, ctx.stepKey),
      );
      return {
        order_id: input.order_id,
        status: approval ? "rejected" : "approval-timed-out",
        charged,
        refunded,
      };
    }
    await ctx.sleep("cool-off", input.cool_off_ms);
    const shipped = await ctx.step(
      "ship",
      () => ship(input.order_id, ctx.stepKey),
    );
    return {
      order_id: input.order_id,
      status: "shipped",
      approved_by: approval.payload.by ?? null,
      charged,
      shipped,
    };
  },
});
