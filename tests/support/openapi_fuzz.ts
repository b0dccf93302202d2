/**
 * Requests generated from an OpenAPI 3.1 document (the API's own
 * /openapi.json): for each operation, its path, query and header parameters
 * and its JSON body from their schemas, each value sometimes replaced by a
 * hostile one (huge and negative numbers, dates Postgres cannot hold, NUL,
 * lone surrogates, long strings, the wrong type), parameters sometimes
 * repeated or unknown. Nothing here knows poimen's routes: a route added to
 * the document is fuzzed with no change here.
 */
import fc from "fast-check";

/** A JSON Schema (2020-12) object, as the document holds it. */
export type Schema = Record<string, unknown>;

/** An OpenAPI parameter object. */
interface Parameter {
  name: string;
  in: "path" | "query" | "header" | "cookie";
  required?: boolean;
  explode?: boolean;
  schema?: Schema;
}

/** One operation of the document. */
export interface Operation {
  method: string;
  /** As the document writes it: `/v1/runs/{run_id}`. */
  path: string;
  parameters: Parameter[];
  body?: Schema;
  /** Whether it needs a bearer token (no `security: []` of its own). */
  auth: boolean;
}

/** Every operation of `doc`. */
export function operationsOf(doc: Schema): Operation[] {
  const out: Operation[] = [];
  for (const [path, item] of Object.entries(doc.paths as Record<string, Schema>)) {
    for (const [method, op] of Object.entries(item as Record<string, Schema>)) {
      const content = (op.requestBody as Schema | undefined)?.content as
        | Record<string, { schema: Schema }>
        | undefined;
      out.push({
        method: method.toUpperCase(),
        path,
        parameters: (op.parameters as Parameter[] | undefined) ?? [],
        body: content?.["application/json"]?.schema,
        auth: !(Array.isArray(op.security) && op.security.length === 0),
      });
    }
  }
  return out;
}

/** Strings a hostile client sends, in any field. */
export const HOSTILE_STRINGS: readonly string[] = [
  "",
  "\u0000",
  "a\u0000b",
  "\ud800",
  "x\udc00",
  "\u202e",
  "\r\n",
  "%00",
  "__proto__",
  "'; drop table runs; --",
  "x".repeat(100_000),
  "é".repeat(3_000),
];

/** Numbers at and past every range a field or Postgres has (int4, int8, double). */
export const HOSTILE_NUMBERS: readonly number[] = [
  -1,
  -0,
  0.5,
  -2147483649,
  2147483648,
  9007199254740993,
  -9223372036854775808,
  1e308,
  -1e308,
  5e-324,
];

// Tomorrow's date, as a timestamp's date part: near enough for any "how far ahead" rule.
const SOON = new Date(Date.now() + 24 * 3600 * 1000).toISOString().slice(0, 10);

/**
 * Timestamps a format check may pass and Postgres may not hold (year 0,
 * offsets past ±15:59), or no calendar has; near and far.
 */
export const HOSTILE_DATES: readonly string[] = [
  "0000-01-01T00:00:00Z",
  "0000-12-31T23:59:59.999Z",
  "0001-01-01T00:00:00+16:00",
  `${SOON}T00:00:00+16:00`,
  `${SOON}T00:00:00-16:00`,
  `${SOON}T00:00:00+23:59`,
  `${SOON}T00:00:00.1234567890123+00:00`,
  "9999-12-31T23:59:59-16:00",
  "2030-01-01T00:00:00+16:00",
  "2024-02-30T00:00:00Z",
  `${SOON}T24:00:00Z`,
  `${SOON}T23:59:60Z`,
  "+275760-09-13T00:00:00Z",
  "-000001-01-01T00:00:00Z",
  "1969-12-31T23:59:59.999999999Z",
  `${SOON}T00:00:00\u0000Z`,
];

/**
 * What the generators read: the document (for `$ref`), and values known to
 * matter by property or parameter name (a workflow that exists, a run id
 * that does), mixed in with the generated ones so that requests get past
 * the first check to the later ones.
 */
export interface Context {
  doc: Schema;
  hints?: Record<string, fc.Arbitrary<unknown>>;
}

function hinted(name: string, gen: fc.Arbitrary<unknown>, ctx: Context): fc.Arbitrary<unknown> {
  const hint = ctx.hints?.[name];
  return hint ? fc.oneof({ weight: 3, arbitrary: hint }, { weight: 1, arbitrary: gen }) : gen;
}

/** Undefined 5 times in 6, else `arb`. */
function rarely<T>(arb: fc.Arbitrary<T>): fc.Arbitrary<T | undefined> {
  return fc.oneof({ weight: 5, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: arb });
}

/** Any value of the wrong type for any field. */
const wrongType: fc.Arbitrary<unknown> = fc.oneof(
  fc.constantFrom<unknown>(null, true, false, [], {}, [null], { a: 1 }, 1.5, "1"),
  fc.jsonValue({ maxDepth: 2 }),
);

function resolve(schema: Schema, { doc }: Context): Schema {
  let s = schema;
  for (let i = 0; i < 10 && typeof s.$ref === "string"; i++) {
    const path = (s.$ref as string).replace(/^#\//, "").split("/");
    s = path.reduce((node: Schema, key) => node[key] as Schema, doc);
  }
  return s;
}

/** A string matching `pattern` (a JSON Schema pattern is ECMA-262), or any string. */
function matching(pattern: string | undefined, min: number, max: number): fc.Arbitrary<string> {
  const any = fc.string({ unit: "grapheme", minLength: min, maxLength: Math.min(max, 40) });
  if (pattern === undefined) return any;
  let re: RegExp;
  try {
    re = new RegExp(pattern, "u");
  } catch {
    return any;
  }
  let gen: fc.Arbitrary<string>;
  try {
    gen = fc.stringMatching(re);
    // Some patterns (unicode property classes) only fail once sampled.
    fc.sample(gen, 1);
  } catch {
    return any.filter((s) => re.test(s));
  }
  return gen.filter((s) => s.length >= min && s.length <= max);
}

/**
 * Values `schema` allows, as a client that follows the document would send
 * them (a value of a string schema with a pattern matches it; an integer
 * is within its bounds).
 */
export function valid(schema: Schema, ctx: Context, depth = 0): fc.Arbitrary<unknown> {
  const s = resolve(schema, ctx);
  if (Array.isArray(s.enum)) return fc.constantFrom(...(s.enum as unknown[]));
  if ("const" in s) return fc.constant(s.const);
  for (const key of ["anyOf", "oneOf"] as const) {
    if (Array.isArray(s[key])) {
      return fc.oneof(...(s[key] as Schema[]).map((x) => valid(x, ctx, depth + 1)));
    }
  }
  const types = Array.isArray(s.type) ? s.type as string[] : s.type ? [s.type as string] : [];
  if (types.length === 0) return fc.jsonValue({ maxDepth: 3 });
  return fc.oneof(...types.map((t) => validOfType(t, s, ctx, depth)));
}

function validOfType(type: string, s: Schema, ctx: Context, depth: number): fc.Arbitrary<unknown> {
  switch (type) {
    case "null":
      return fc.constant(null);
    case "boolean":
      return fc.boolean();
    case "integer":
      return fc.integer({
        min: (s.minimum as number | undefined) ?? -(2 ** 31),
        max: (s.maximum as number | undefined) ?? 2 ** 31 - 1,
      });
    case "number":
      return fc.double({ noNaN: true, noDefaultInfinity: true });
    case "string": {
      const min = (s.minLength as number | undefined) ?? 0;
      const max = (s.maxLength as number | undefined) ?? 40;
      if (s.format === "date-time") {
        return fc.date({
          // From long past to as far ahead as a schedule usually goes.
          min: new Date("2000-01-01T00:00:00Z"),
          max: new Date(Date.now() + 300 * 24 * 3600 * 1000),
          noInvalidDate: true,
        }).map((d) => d.toISOString());
      }
      if (s.format === "uuid") return fc.uuid();
      return matching(s.pattern as string | undefined, min, max);
    }
    case "array": {
      if (depth > 4) return fc.constant([]);
      return fc.array(valid((s.items as Schema | undefined) ?? {}, ctx, depth + 1), {
        minLength: (s.minItems as number | undefined) ?? 0,
        maxLength: Math.min((s.maxItems as number | undefined) ?? 3, 3),
      });
    }
    case "object": {
      const props = (s.properties ?? {}) as Record<string, Schema>;
      if (depth > 4) return fc.constant({});
      const record: Record<string, fc.Arbitrary<unknown>> = {};
      for (const [k, v] of Object.entries(props)) {
        record[k] = hinted(k, valid(v, ctx, depth + 1), ctx);
      }
      return fc.record(record, { requiredKeys: (s.required as string[] | undefined) ?? [] });
    }
    default:
      return fc.jsonValue({ maxDepth: 2 });
  }
}

/**
 * A value the schema may or may not allow: valid, or hostile for its type;
 * an object mostly with its own fields, each valid or hostile, sometimes one
 * more that no schema has.
 */
export function value(schema: Schema, ctx: Context, depth = 0): fc.Arbitrary<unknown> {
  const s = resolve(schema, ctx);
  const types = typesOf(s, ctx);
  const hostile: fc.WeightedArbitrary<unknown>[] = [
    { weight: 1, arbitrary: wrongType },
    { weight: 1, arbitrary: fc.constantFrom(...HOSTILE_STRINGS) },
  ];
  if (types.includes("integer") || types.includes("number")) {
    hostile.push({ weight: 2, arbitrary: fc.constantFrom(...HOSTILE_NUMBERS) });
  }
  if (types.includes("string")) {
    // A timestamp's own hostile values first: what its format check may let through.
    const weight = s.format === "date-time" || hasDateTime(s) ? 6 : 1;
    hostile.push({ weight, arbitrary: fc.constantFrom(...HOSTILE_DATES) });
  }
  if (types.includes("object") && depth < 3 && s.properties) {
    const props = Object.entries(s.properties as Record<string, Schema>);
    const required = (s.required as string[] | undefined) ?? [];
    // A valid object with one field's value hostile (or that field added when
    // optional): what gets a bad value past every other check to its own.
    const oneField = fc.tuple(
      valid(s, ctx, depth) as fc.Arbitrary<Record<string, unknown>>,
      fc.oneof(...props.map(([k, v]) => value(v, ctx, depth + 1).map((x) => [k, x] as const))),
    ).map(([r, [k, x]]) => ({ ...r, [k]: x }));
    const record: Record<string, fc.Arbitrary<unknown>> = {};
    for (const [k, v] of props) {
      record[k] = hinted(
        k,
        fc.oneof(
          { weight: 3, arbitrary: valid(v, ctx, depth + 1) },
          { weight: 1, arbitrary: value(v, ctx, depth + 1) },
        ),
        ctx,
      );
    }
    const fields = fc.tuple(
      fc.record(record, { requiredKeys: required }),
      rarely(fc.tuple(fc.constantFrom("extra", "__proto__", "\u0000"), wrongType)),
    ).map(([r, extra]) => extra ? { ...r, [extra[0]]: extra[1] } : r);
    return fc.oneof(
      { weight: 4, arbitrary: oneField },
      { weight: 2, arbitrary: fields },
      { weight: 1, arbitrary: valid(s, ctx, depth) },
      { weight: 1, arbitrary: fc.oneof(...hostile) },
    );
  }
  return fc.oneof(
    { weight: 1, arbitrary: valid(s, ctx, depth) },
    { weight: 1, arbitrary: fc.oneof(...hostile) },
  );
}

/** The types a schema allows, its `anyOf` / `oneOf` members' included. */
function typesOf(s: Schema, ctx: Context): string[] {
  const own = Array.isArray(s.type) ? s.type as string[] : s.type ? [s.type as string] : [];
  const members = [...(s.anyOf as Schema[] ?? []), ...(s.oneOf as Schema[] ?? [])];
  return [...own, ...members.flatMap((m) => typesOf(resolve(m, ctx), ctx))];
}

// A nullable timestamp is `anyOf: [{ format: "date-time" }, { type: "null" }]`.
function hasDateTime(s: Schema): boolean {
  return ["anyOf", "oneOf"].some((k) =>
    Array.isArray(s[k]) && (s[k] as Schema[]).some((x) => x.format === "date-time")
  );
}

/** How a parameter's value goes into text (a query value, a path segment, a header). */
export function asText(v: unknown, explode = true): string {
  if (typeof v === "string") return v;
  if (Array.isArray(v) && !explode) return v.map((x) => asText(x)).join(",");
  if (typeof v === "number" && !Number.isFinite(v)) return String(v);
  return JSON.stringify(v) ?? "";
}

/** Percent-encoding as a client would do it; a lone surrogate as its would-be UTF-8 bytes. */
export function encode(s: string): string {
  try {
    return encodeURIComponent(s);
  } catch {
    return encodeURIComponent(s.toWellFormed()).replaceAll("%EF%BF%BD", "%ED%A0%80");
  }
}

/** One generated request for `op`: its URL (path and query), headers and body. */
export interface Generated {
  url: string;
  headers: [string, string][];
  body?: string;
}

/**
 * Requests for `op`: each parameter present or not (a required one always), with a value from `value`; a query parameter sometimes given
 * twice or an unknown one added; a header sometimes repeated.
 */
export function requests(op: Operation, ctx: Context): fc.Arbitrary<Generated> {
  const params = op.parameters.filter((p) => p.in !== "cookie");
  const each = params.map((p) => {
    const schema = p.schema ?? {};
    const text = hinted(
      p.name,
      fc.oneof(
        { weight: 2, arbitrary: valid(schema, ctx) },
        { weight: 1, arbitrary: value(schema, ctx) },
      ),
      ctx,
    ).map((v) => asText(v, p.explode ?? true));
    return fc.record({
      present: p.required ? fc.constant(true) : fc.boolean(),
      text,
      twice: fc.oneof({ weight: 9, arbitrary: fc.constant(false) }, {
        weight: 1,
        arbitrary: fc.constant(true),
      }),
    });
  });
  return fc.record({
    values: fc.tuple(...each),
    unknown: rarely(fc.tuple(fc.constantFrom("x", "limit[]", "\u0000"), fc.string())),
    body: op.body === undefined ? fc.constant(undefined) : fc.oneof(
      { weight: 8, arbitrary: value(op.body, ctx).map((v) => JSON.stringify(v) ?? "null") },
      { weight: 1, arbitrary: fc.constantFrom("", "{", "[]", "\u0000", "null") },
    ),
  }).map(({ values, unknown, body }) => {
    let path = op.path;
    const query: string[] = [];
    const headers: [string, string][] = [];
    params.forEach((p, i) => {
      const { present, text, twice } = values[i];
      if (p.in === "path") {
        path = path.replace(`{${p.name}}`, encode(text));
        return;
      }
      if (!present) return;
      if (p.in === "query") {
        const part = `${encode(p.name)}=${encode(text)}`;
        query.push(part);
        if (twice) query.push(part);
      } else {
        const h = headerText(text);
        headers.push([p.name, h]);
        if (twice) headers.push([p.name, h]);
      }
    });
    if (unknown) query.push(`${encode(unknown[0])}=${encode(unknown[1])}`);
    return {
      url: path + (query.length ? `?${query.join("&")}` : ""),
      headers,
      body,
    };
  });
}

/**
 * A value the Fetch API lets into a header: Latin-1 without NUL, CR or LF
 * (others stand in for them), outer whitespace trimmed as HTTP does.
 */
function headerText(s: string): string {
  return [...s].map((c) => {
    const code = c.codePointAt(0)!;
    return code === 0 || code === 10 || code === 13 ? "?" : code > 0xff ? "x" : c;
  }).join("").slice(0, 8_000);
}
