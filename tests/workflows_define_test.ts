import assert from "node:assert/strict";
import { concurrencyKeyOf } from "../contracts/concurrency.ts";
import { z } from "zod";
import {
  defineWorkflow,
  implement,
  isWorkflow,
  isWorkflowDefinition,
} from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { loadWorkflows } from "../worker/process.ts";
import { ConfigError } from "../core/errors.ts";
import { runWorker } from "../worker/run_worker.ts";

const handler = () => Promise.resolve(null);

Deno.test("defineWorkflow: keeps the definition, adds its input as JSON Schema (input side), and marks it", () => {
  const wf = defineWorkflow({
    name: "billing.invoice",
    version: 2,
    maxAttempts: 5,
    input: z.object({ n: z.number().int().min(1), note: z.string().optional() }),
    handler,
  });
  assert.equal(isWorkflow(wf), true);
  assert.equal(
    isWorkflow({ name: wf.name, version: wf.version, input: wf.input, handler }),
    false,
    "a look-alike is not a definition",
  );
  assert.equal(wf.maxAttempts, 5);
  assert.deepEqual(wf.inputSchema.required, ["n"]);
  assert.deepEqual((wf.inputSchema.properties as Record<string, unknown>).n, {
    type: "integer",
    minimum: 1,
    maximum: Number.MAX_SAFE_INTEGER,
  });
  assert.ok(Object.isFrozen(wf));
});

Deno.test("defineWorkflow: a bad name, version, maxAttempts, concurrency, input or handler throws a TypeError naming the workflow", () => {
  const ok = { name: "a", version: 1, input: z.unknown(), handler };
  for (
    const [bad, pattern] of [
      [{ ...ok, name: "Bad Name" }, /Bad Name@1: name must match/],
      [{ ...ok, version: 0 }, /a@0: version must be/],
      [{ ...ok, version: 1.5 }, /version must be/],
      [{ ...ok, maxAttempts: 0 }, /maxAttempts must be/],
      [{ ...ok, input: { parse: () => 1 } }, /input must be a zod schema/],
      [{ ...ok, handler: "no" }, /handler must be a function/],
      [{ ...ok, output: { parse: () => 1 } }, /a@1: output must be a zod schema/],
      [{ ...ok, concurrency: { limit: 0 } }, /a@1: concurrency.limit must be an integer/],
      [{ ...ok, concurrency: { limit: 2.5 } }, /concurrency.limit must be an integer/],
      [{ ...ok, concurrency: { limit: 1, key: "customer_id" } }, /concurrency.key must be a JSON/],
      [{ ...ok, concurrency: { limit: 1, key: "/a~2" } }, /concurrency.key must be a JSON/],
      [{ ...ok, concurrency: { limit: 1, per: "/a" } }, /concurrency has unknown field per/],
    ] as const
  ) {
    assert.throws(() => defineWorkflow(bad as never), (e: unknown) => {
      assert.ok(e instanceof TypeError);
      assert.match(e.message, pattern);
      return true;
    });
  }
});

Deno.test("defineWorkflow: what JSON Schema cannot say (a refinement, a transform, a date) admits anything at the door", () => {
  const wf = defineWorkflow({
    name: "odd",
    version: 1,
    input: z.object({
      even: z.number().refine((n) => n % 2 === 0),
      len: z.string().transform((s) => s.length),
      when: z.date(),
    }),
    handler,
  });
  const props = wf.inputSchema.properties as Record<string, unknown>;
  assert.deepEqual(props.even, { type: "number" });
  assert.deepEqual(props.len, { type: "string" });
  assert.deepEqual(props.when, {});
});

Deno.test("registry: one name@version twice is refused naming it; claims and the catalog see every hosted version", () => {
  const a = defineWorkflow({ name: "a", version: 1, input: z.unknown(), handler });
  const a2 = defineWorkflow({ name: "a", version: 2, input: z.unknown(), maxAttempts: 2, handler });
  assert.throws(() => new WorkflowRegistry([a, a]), /workflow a@1 is given twice/);
  const r = new WorkflowRegistry([a2, a]);
  assert.deepEqual(r.list(), ["a@1", "a@2"]);
  assert.deepEqual(r.hosted(), { names: ["a", "a"], versions: [2, 1] });
  assert.deepEqual(r.catalogVersions().map((v) => [v.version, v.max_attempts]), [[2, 2], [
    1,
    null,
  ]]);
  assert.equal(r.resolve("a@2"), a2);
  assert.equal(r.resolve("a"), undefined, "a worker runs pinned versions only");
});

Deno.test("defineWorkflow: without a handler it is a definition only; implement adds one, keeping every field; the output is registered as JSON Schema (output side)", () => {
  const def = defineWorkflow({
    name: "shop.order",
    version: 3,
    input: z.object({ sku: z.string(), qty: z.number().int().default(1) }),
    output: z.object({ total: z.number(), note: z.string().default("") }),
    maxAttempts: 2,
    concurrency: { limit: 4, key: "/sku" },
    tenants: ["acme"],
  });
  assert.equal(isWorkflowDefinition(def), true);
  assert.equal(isWorkflow(def), false, "no handler: a worker cannot host it");
  assert.ok(Object.isFrozen(def));
  assert.deepEqual(def.inputSchema.required, ["sku"], "the input side: qty has a default");
  assert.deepEqual(def.outputSchema?.required, ["total", "note"], "the output side: note is set");
  assert.equal(defineWorkflow({ ...def, input: z.unknown() }).outputSchema !== undefined, true);
  assert.equal(
    defineWorkflow({ name: "n", version: 1, input: z.unknown() }).outputSchema,
    undefined,
  );

  const impl = implement(def, (input) => ({ total: input.qty * 2 }));
  assert.equal(isWorkflow(impl), true);
  assert.equal(isWorkflowDefinition(impl), true);
  assert.ok(Object.isFrozen(impl));
  for (const key of ["name", "version", "input", "output", "maxAttempts", "tenants"] as const) {
    assert.equal(impl[key], def[key], key);
  }
  assert.deepEqual(impl.concurrency, def.concurrency);
  assert.equal(impl.inputSchema, def.inputSchema);
  assert.equal(impl.outputSchema, def.outputSchema);
  const [row] = new WorkflowRegistry([impl]).catalogVersions();
  assert.deepEqual(row.output_schema, def.outputSchema);
  assert.equal(
    new WorkflowRegistry([implement(defineWorkflow({ ...def, output: undefined }), handler)])
      .catalogVersions()[0].output_schema,
    null,
    "no output: any JSON",
  );
  assert.throws(
    () => new WorkflowRegistry([def as never]),
    /shop\.order@3 is a definition without/,
  );
});

Deno.test("--workflows: takes every implementation exported and those in exported arrays, once each, leaving definitions out; a module with none, or that cannot load, is a ConfigError naming it", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const define = new URL("../workflows/define.ts", import.meta.url).href;
    await Deno.writeTextFile(
      `${dir}/mod.ts`,
      `import { z } from "zod";
import { defineWorkflow } from "${define}";
export const one = defineWorkflow({ name: "one", version: 1, input: z.unknown(), handler: () => Promise.resolve(1) });
const two = defineWorkflow({ name: "two", version: 1, input: z.unknown(), handler: () => Promise.resolve(2) });
export default [one, two];
export const notAWorkflow = { name: "three", version: 1 };
export const definitionOnly = defineWorkflow({ name: "four", version: 1, input: z.unknown() });
`,
    );
    await Deno.writeTextFile(`${dir}/none.ts`, `export const x = 1;\n`);
    await Deno.writeTextFile(
      `${dir}/definitions.ts`,
      `import { z } from "zod";
import { defineWorkflow } from "${define}";
export const a = defineWorkflow({ name: "a", version: 2, input: z.unknown() });
export const b = defineWorkflow({ name: "b", version: 1, input: z.unknown() });
`,
    );
    const found = await loadWorkflows(`${dir}/mod.ts`);
    assert.deepEqual(found.map((w) => w.name).sort(), ["one", "two"]);
    await assert.rejects(
      () => loadWorkflows(`${dir}/none.ts`),
      (e: unknown) => e instanceof ConfigError && /none\.ts: exports no workflow/.test(e.message),
    );
    await assert.rejects(
      () => loadWorkflows(`${dir}/definitions.ts`),
      (e: unknown) =>
        e instanceof ConfigError &&
        /definitions\.ts: exports no workflow .*a@2, b@1 are definitions without a handler/
          .test(e.message),
    );
    await assert.rejects(
      () => loadWorkflows(`${dir}/missing.ts`),
      (e: unknown) => e instanceof ConfigError && /missing\.ts: cannot load it/.test(e.message),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("concurrency: the key is the input's value at the pointer as text; what cannot be a key says why", () => {
  assert.deepEqual(concurrencyKeyOf({ customer_id: "c-1" }, "/customer_id"), { key: "c-1" });
  assert.deepEqual(concurrencyKeyOf({ a: { "b/c": [7, 8] } }, "/a/b~1c/1"), { key: "8" });
  assert.deepEqual(concurrencyKeyOf({ on: true }, "/on"), { key: "true" });
  assert.deepEqual(concurrencyKeyOf({ anything: 1 }, undefined), { key: "" });
  for (const input of [{}, { customer_id: null }, { customer_id: { x: 1 } }, null, "str"]) {
    assert.ok("problem" in concurrencyKeyOf(input, "/customer_id"), JSON.stringify(input));
  }
  assert.ok("problem" in concurrencyKeyOf({ k: "x".repeat(256) }, "/k"));
  // An inherited property is not the input's.
  assert.ok("problem" in concurrencyKeyOf({}, "/constructor"));
});

Deno.test("registry: concurrency limits are registered with the version, and split the claims", () => {
  const limited = defineWorkflow({
    name: "l",
    version: 1,
    input: z.unknown(),
    concurrency: { limit: 3, key: "/k" },
    handler,
  });
  const plain = defineWorkflow({ name: "p", version: 1, input: z.unknown(), handler });
  const registry = new WorkflowRegistry([limited, plain]);
  assert.deepEqual(
    registry.catalogVersions().map((v) => [v.name, v.concurrency_limit, v.concurrency_key]),
    [["l", 3, "/k"], ["p", null, null]],
  );
  assert.deepEqual(registry.hostedByLimit(), {
    unlimited: { names: ["p"], versions: [1] },
    limited: { names: ["l"], versions: [1] },
  });
});

Deno.test('defineWorkflow: tenants is a tenant scope, stored canonical (sorted, once each); ["*"] is every tenant; anything else is a TypeError naming the workflow', () => {
  const base = { name: "team.report", version: 1, input: z.unknown(), handler };
  const some = defineWorkflow({ ...base, tenants: ["team-*", "acme", "acme"] });
  assert.deepEqual(some.tenants, ["acme", "team-*"]);
  assert.equal(new WorkflowRegistry([some]).catalogVersions()[0].tenants, "acme,team-*");
  const every = defineWorkflow({ ...base, tenants: ["*"] });
  assert.equal(every.tenants, undefined);
  assert.equal(new WorkflowRegistry([every]).catalogVersions()[0].tenants, null);
  assert.equal(new WorkflowRegistry([defineWorkflow(base)]).catalogVersions()[0].tenants, null);
  for (const tenants of [[], ["Acme"], ["acme)|(.*"], ["a*b"], "acme" as unknown as string[]]) {
    assert.throws(
      () => defineWorkflow({ ...base, tenants }),
      (e: unknown) => e instanceof TypeError && /^workflow team\.report@1: tenants/.test(e.message),
      JSON.stringify(tenants),
    );
  }
});

Deno.test("runWorker: what refuses to start (a bad variable, no workflows, a bare definition) resolves with 2 for the caller to use, and leaves Deno.exitCode alone", async () => {
  const before = Deno.exitCode;
  const definition = defineWorkflow({ name: "bare", version: 1, input: z.unknown() });
  const env = { DATABASE_URL: "postgres://127.0.0.1:1/none", WORKER_METRICS_PORT: "0" };
  for (
    const options of [
      { workflows: [], env },
      { workflows: [definition as never], env },
      { workflows: [defineWorkflow({ ...definition, handler })], env: { ...env, LOG_LEVEL: "x" } },
    ]
  ) {
    assert.equal(await runWorker(options), 2);
    assert.equal(Deno.exitCode, before, "a library never sets the process's exit code");
  }
});

Deno.test("defineWorkflow: declared signals are registered as JSON Schema (input side), kept by implement, typed in the handler; a bad name or schema is a TypeError naming the workflow", () => {
  const def = defineWorkflow({
    name: "shop.approve",
    version: 1,
    input: z.object({}),
    signals: { approval: z.object({ ok: z.boolean(), note: z.string().default("") }) },
  });
  assert.deepEqual(def.signalSchemas?.approval.required, ["ok"], "the input side: note optional");
  assert.ok(Object.isFrozen(def.signals) && Object.isFrozen(def.signalSchemas));
  const impl = implement(def, async (_input, ctx) => {
    const got = await ctx.waitForSignal("approval");
    const ok: boolean | undefined = got?.payload.ok;
    return ok;
  });
  assert.equal(impl.signals, def.signals);
  assert.equal(impl.signalSchemas, def.signalSchemas);
  const [row] = new WorkflowRegistry([impl]).catalogVersions();
  assert.deepEqual(row.signal_schemas, def.signalSchemas);
  const none = implement(defineWorkflow({ name: "n", version: 1, input: z.unknown() }), handler);
  assert.equal(new WorkflowRegistry([none]).catalogVersions()[0].signal_schemas, null);
  // The handler's wait is typed: an undeclared name's payload is unknown.
  const typed = defineWorkflow({
    name: "t",
    version: 1,
    input: z.object({}),
    signals: { go: z.object({ n: z.number() }) },
    async handler(_input, ctx) {
      const go = await ctx.waitForSignal("go");
      const n: number | undefined = go?.payload.n;
      const other = await ctx.waitForSignal("other");
      // @ts-expect-error: an undeclared signal's payload is unknown
      void other?.payload.n;
      return n;
    },
  });
  assert.equal(typeof typed.handler, "function");
  for (
    const [signals, pattern] of [
      [{ "a#b": z.object({}) }, /t@1: signal "a#b"/],
      [{ ok: { not: "zod" } }, /t@1: signal ok must be a zod schema/],
      [[z.object({})], /t@1: signals must be an object/],
    ] as const
  ) {
    assert.throws(
      () => defineWorkflow({ name: "t", version: 1, input: z.object({}), signals } as never),
      (e: unknown) => e instanceof TypeError && pattern.test(e.message),
      String(pattern),
    );
  }
});

Deno.test("defineWorkflow: debounce is { key?, period, maxWait } in milliseconds, kept by implement and registered; anything else is a TypeError naming the workflow", () => {
  const d = defineWorkflow({
    name: "digest",
    version: 1,
    input: z.object({ customer_id: z.string() }),
    debounce: { key: "/customer_id", period: 30_000, maxWait: 300_000 },
  });
  assert.deepEqual(d.debounce, { key: "/customer_id", period: 30_000, maxWait: 300_000 });
  const impl = implement(d, handler);
  assert.deepEqual(impl.debounce, d.debounce);
  assert.deepEqual(new WorkflowRegistry([impl]).catalogVersions()[0].debounce, {
    key: "/customer_id",
    period: 30_000,
    maxWait: 300_000,
  });
  assert.equal(
    new WorkflowRegistry([defineWorkflow({ name: "p", version: 1, input: z.unknown(), handler })])
      .catalogVersions()[0].debounce,
    null,
  );
  for (
    const [bad, why] of [
      [{ period: 0, maxWait: 10 }, /debounce.period/],
      [{ period: 1.5, maxWait: 10 }, /debounce.period/],
      [{ period: 10, maxWait: 5 }, /debounce.maxWait/],
      [{ period: 10 }, /debounce.maxWait/],
      [{ period: 10, maxWait: 8 * 24 * 3600_000 }, /debounce.maxWait/],
      [{ period: 10, maxWait: 10, key: "customer_id" }, /debounce.key/],
      [{ period: 10, maxWait: 10, wait: 1 }, /unknown field wait/],
      [null, /debounce must be/],
    ] as const
  ) {
    assert.throws(
      () =>
        defineWorkflow({
          name: "digest",
          version: 2,
          input: z.unknown(),
          debounce: bad as never,
        }),
      (e: Error) => e instanceof TypeError && /digest@2/.test(e.message) && why.test(e.message),
      JSON.stringify(bad),
    );
  }
});
