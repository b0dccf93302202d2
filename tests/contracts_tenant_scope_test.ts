import assert from "node:assert/strict";
import { parseTenantScope } from "../contracts/tenant_scope.ts";

Deno.test("a tenant scope allows its ids and prefixes and nothing else", () => {
  const { scope } = parseTenantScope("beta, acme,team-*");
  assert.ok(scope);
  assert.equal(scope.text, "acme,beta,team-*");
  for (const t of ["acme", "beta", "team-a", "team-"]) assert.ok(scope.allows(t), t);
  for (const t of ["acme2", "xacme", "team", "TEAM-a", "", "acme,beta"]) {
    assert.equal(scope.allows(t), false, t);
  }
});

Deno.test("a tenant scope of * allows every tenant id and no other string", () => {
  const { scope } = parseTenantScope("*");
  assert.ok(scope?.all);
  assert.ok(scope.allows("anyone"));
  assert.equal(scope.allows("not a tenant"), false);
});

Deno.test("a tenant scope refuses regular expressions in one line", () => {
  for (const bad of ["acme)|(.*", "(a+)+", ".*", "a*b", "", " , ", "UPPER", "a**"]) {
    const { problem } = parseTenantScope(bad);
    assert.ok(problem, bad);
    assert.equal(problem.includes("\n"), false);
  }
});

Deno.test("a tenant scope matches a long near-miss id by prefix, not by backtracking", () => {
  const { scope } = parseTenantScope(["a*", "aa*", "b"]);
  assert.ok(scope);
  // A regex like (a+)+ would take exponential time here; the scope is a lookup.
  assert.equal(scope.allows("a".repeat(62) + "!"), false);
  assert.equal(scope.allows("a".repeat(63)), true);
});
