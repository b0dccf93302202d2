-- Per-tenant quotas, checked by the API before a run reaches admission
-- (admission/quota.ts): in a multi-tenant queue one tenant must not be able
-- to fill the database, nor take the admission path from the others.
--
-- max_queued: most queued runs the tenant may have; past it POST /v1/runs is
-- a 429 queue-full. admission_rate: runs admitted per second (a token bucket
-- per API process), past it a 429 rate-limited. null means unlimited, which
-- is every existing tenant: adding nullable columns without a default
-- rewrites nothing. Set with `deno task tenant <tenant> --max-queued N
-- --rate R`; the APIs read them again every QUOTA_REFRESH_MS, so a change
-- needs no restart.
--
-- 011 is another change's number (concurrency limits and priorities).
alter table tenants
  add column max_queued     integer check (max_queued >= 0),
  add column admission_rate double precision check (admission_rate > 0);
