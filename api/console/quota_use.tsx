/**
 * The queue page's quota use: the tenant's queued runs against its
 * max_queued, and its admission rate (`deno task tenant`). Nothing when the
 * tenant has no quota. Its own file, so the queue page grows by one line.
 */
import { COUNT_CAP } from "../../db/queue_overview.ts";
import type { TenantQuota } from "../../db/tenant_quotas.ts";

/** The tenant's quota use; `queued` is the queue page's capped count. */
export function QuotaUse({ quota, queued }: { quota: TenantQuota | undefined; queued: number }) {
  if (!quota || (quota.max_queued === null && quota.admission_rate === null)) return null;
  const shown = queued >= COUNT_CAP ? `${COUNT_CAP}+` : String(queued);
  const full = quota.max_queued !== null && queued >= quota.max_queued;
  return (
    <div class="cards" id="quota">
      <div class="card">
        <div class="value" id="quota-queued">
          {quota.max_queued === null ? "unlimited" : `${shown} / ${quota.max_queued}`}
        </div>
        <div class="label">
          queued of max-queued{full ? " (full: admissions get 429 queue-full)" : ""}
        </div>
      </div>
      <div class="card">
        <div class="value" id="quota-rate">
          {quota.admission_rate === null ? "unlimited" : `${quota.admission_rate}/s`}
        </div>
        <div class="label">admission rate (per API process)</div>
      </div>
    </div>
  );
}
