/**
 * Schedules declared in a definition (workflows/schedules.ts): checked where
 * the definition is made, defaults applied, tenants resolved, and kept by
 * `implement` and the catalog's registration.
 */
import assert from "node:assert/strict";
import { z } from "zod";
import { defineWorkflow, implement } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";

const input = z.object({ full: z.boolean() });
const base = { name: "report", version: 1, input, tenants: ["acme", "globex"] };

Deno.test("declared schedules: defaults applied, the definition's tenants taken, kept by implement and the catalog", () => {
  const def = defineWorkflow({
    ...base,
    schedules: [
      { id: "nightly", cron: "30 2 * * *", timezone: "Europe/Paris", input: { full: true } },
      {
        id: "hourly",
        cron: "0 * * * *",
        input: { full: false },
        overlap: "skip",
        catchup: "latest",
        tenants: ["globex"],
      },
    ],
  });
  assert.deepEqual(def.schedules, [
    {
      id: "nightly",
      cron: "30 2 * * *",
      timezone: "Europe/Paris",
      input: { full: true },
      overlap: "allow",
      catchup: "skip",
      tenants: ["acme", "globex"],
    },
    {
      id: "hourly",
      cron: "0 * * * *",
      timezone: "UTC",
      input: { full: false },
      overlap: "skip",
      catchup: "latest",
      tenants: ["globex"],
    },
  ]);
  const impl = implement(def, () => null);
  assert.equal(impl.schedules, def.schedules);
  const [version] = new WorkflowRegistry([impl]).catalogVersions();
  assert.deepEqual(version.schedules, def.schedules);
  assert.equal(defineWorkflow(base).schedules, undefined, "none declared");
  assert.equal(
    new WorkflowRegistry([implement(defineWorkflow(base), () => null)]).catalogVersions()[0]
      .schedules,
    null,
  );
});

Deno.test("declared schedules: a bad id, cron, zone, policy, tenant list or input throws at definition, naming the schedule", () => {
  const ok = { id: "nightly", cron: "30 2 * * *", input: { full: true } };
  const cases: [Record<string, unknown>, Record<string, unknown>, RegExp][] = [
    [{}, { ...ok, cron: "30 2 * *" }, /report@1: schedule nightly: expected 5 fields/],
    [{}, { ...ok, cron: "61 2 * * *" }, /report@1: schedule nightly: /],
    [{}, { ...ok, timezone: "Mars/Olympus" }, /schedule nightly: unknown IANA time zone/],
    [{}, { ...ok, id: "a:b" }, /report@1: schedules\[0\]: id must be/],
    [{}, { ...ok, overlap: "queue" }, /schedule nightly: overlap must be/],
    [{}, { ...ok, catchup: "some" }, /schedule nightly: catchup must be/],
    [{}, { ...ok, input: { full: "yes" } }, /schedule nightly: input.full: /],
    [{}, { ...ok, input: undefined }, /schedule nightly: input: /],
    [{}, { ...ok, tenants: ["initech"] }, /schedule nightly: tenant initech may not start/],
    [{}, { ...ok, tenants: ["team-*"] }, /schedule nightly: tenants: "team-\*" is not a tenant id/],
    [{}, { ...ok, tenants: [] }, /schedule nightly: tenants must be a non-empty list/],
    [{ tenants: undefined }, ok, /schedule nightly: name its tenants .* every tenant/],
    [{ tenants: ["acme", "team-*"] }, ok, /schedule nightly: name its tenants .* a prefix/],
  ];
  for (const [def, schedule, pattern] of cases) {
    assert.throws(
      () => defineWorkflow({ ...base, ...def, schedules: [schedule] } as never),
      (e: unknown) => {
        assert.ok(e instanceof TypeError, String(e));
        assert.match(e.message, pattern);
        return true;
      },
      JSON.stringify(schedule),
    );
  }
  assert.throws(
    () => defineWorkflow({ ...base, schedules: [ok, ok] }),
    /report@1: schedule nightly declared twice/,
  );
  assert.throws(() => defineWorkflow({ ...base, schedules: ok as never }), /must be a list/);
  // A definition for every tenant schedules for the tenants its entries name.
  const everyone = defineWorkflow({
    name: "report",
    version: 1,
    input,
    schedules: [{ ...ok, tenants: ["beta", "acme", "beta"] }],
  });
  assert.deepEqual(everyone.schedules![0].tenants, ["acme", "beta"]);
});

Deno.test("declared schedules: a schedule's input is typed by the definition's input (and checked)", () => {
  assert.throws(
    () =>
      defineWorkflow({
        ...base,
        // @ts-expect-error: full must be a boolean (the type check fails without this line)
        schedules: [{ id: "x", cron: "0 * * * *", input: { full: 1 } }],
      }),
    /schedule x: input.full/,
  );
});
