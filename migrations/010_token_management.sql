-- Tokens an operator can manage (`deno task token list|revoke`): a stable
-- public id to name a token by (its hash is the secret's fingerprint and is
-- never shown), an optional expiry, a coarse last use, and for a service
-- token an optional pattern limiting the tenants it may act for.
--
-- The id's volatile default rewrites api_tokens once, which holds a handful
-- of rows per tenant.
alter table api_tokens
  add column token_id       uuid not null default gen_random_uuid(),
  add column expires_at     timestamptz,
  -- Set when the API loads the token (a cache miss), at most once per five
  -- minutes per token (db/auth.ts): never a write per request.
  add column last_used_at   timestamptz,
  -- A JavaScript regular expression matched against the whole tenant id
  -- (`acme|beta`); null: any tenant. Checked to compile when created
  -- (cli/token.ts); one that does not compile matches no tenant.
  add column tenant_pattern text check (length(tenant_pattern) between 1 and 1000),
  add constraint api_tokens_token_id_key unique (token_id),
  add constraint api_tokens_pattern_service_only check (tenant_pattern is null or kind = 'service');

-- `deno task token list <tenant>`.
create index api_tokens_tenant_idx on api_tokens (tenant_id, created_at);
