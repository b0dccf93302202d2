-- A service token's tenant_pattern is a tenant scope from now on
-- (`acme,beta,team-*`: tenant ids and prefixes, contracts/tenant_scope.ts),
-- no longer a regular expression: a regular expression written by whoever
-- mints a token escaped its anchors (`acme)|(.*` acted for every tenant) and
-- backtracked exponentially on a header anyone can send (`(a+)+`).
--
-- Patterns written in the part of the old grammar that says the same thing
-- are rewritten to it: alternatives of whole tenant ids and of a literal
-- prefix followed by `.*`, optionally in one group (`acme|beta` → `acme,beta`,
-- `(team-.*|ops)` → `team-*,ops`); `.*` alone, any tenant, becomes null, as
-- the CLI stores `--tenants '*'`. The regular expression was matched against
-- the whole id, and tenant ids hold only [a-z0-9_-], so each rewrite allows
-- exactly the tenants it allowed before. Anything else (`.+`, classes,
-- quantifiers, upper case) is left as it was: the API reads it as a scope,
-- which it is not, so the token allows no tenant (fail closed, as a pattern
-- that did not compile always did) and the API logs a warning naming the
-- token's id when it loads it. Mint a new token with --tenants and revoke it.
--
-- api_tokens holds a handful of rows per tenant: one update, no index work.
with alternatives as (
  select t.token_id, alt
    from api_tokens t,
         regexp_split_to_table(
           regexp_replace(t.tenant_pattern, '^\((?:\?:)?([^()]*)\)$', '\1'), '\|') as alt
   where t.tenant_pattern is not null
),
rewritten as (
  select token_id,
         bool_and(alt ~ '^[a-z0-9_-]{1,63}$' or alt ~ '^[a-z0-9_-]{0,62}\.\*$') as fits,
         bool_or(alt = '.*') as everyone,
         string_agg(case when alt ~ '\.\*$' then left(alt, -2) || '*' else alt end, ','
                    order by alt ~ '\.\*$', alt) as scope
    from alternatives
   group by token_id
)
update api_tokens t
   set tenant_pattern = case when r.everyone then null else r.scope end
  from rewritten r
 where t.token_id = r.token_id and r.fits;
