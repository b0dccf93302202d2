-- Tenants and the bearer tokens that act for them.
-- Tenant ids become Kafka topic names (poimen.<tenant>.dispatch), hence the
-- restricted alphabet and no dot.
create table tenants (
  tenant_id  text primary key check (tenant_id ~ '^[a-z0-9_-]{1,63}$'),
  created_at timestamptz not null default now()
);

-- Tokens are random 256-bit secrets; only their SHA-256 is stored. A slow
-- password hash buys nothing for high-entropy secrets and would cost every
-- request. A tenant token acts for its tenant; a service token (tenant_id
-- null) may act for the tenant named in the Poimen-Tenant header.
create table api_tokens (
  token_hash   bytea primary key,
  kind         text not null check (kind in ('tenant', 'service')),
  tenant_id    text references tenants (tenant_id),
  name         text not null,
  created_at   timestamptz not null default now(),
  revoked_at   timestamptz,
  check ((kind = 'tenant') = (tenant_id is not null))
);
