/**
 * What a JSON value must be for poimen to store it: Postgres' jsonb refuses
 * NUL and unpaired surrogates, and nothing recurses over a value deeper than
 * `MAX_JSON_DEPTH`. Checked once at the door (contracts/runs.ts), so no
 * value reaches Postgres that it would refuse. Depends on zod alone.
 */
import { z } from "zod";

/**
 * The deepest nesting of arrays and objects a run's `input` may have: the
 * value itself is level 1, so `[[1]]` is 2 deep. Deeper input is refused
 * before anything recurses over it (Postgres' jsonb parser, a workflow's
 * schema, a handler).
 */
export const MAX_JSON_DEPTH = 64;

// A problem body lists at most this many failing fields: a body of 100,000
// bad strings must not make a 100,000-entry answer.
const MAX_REPORTED = 20;

/** One reason a value cannot be stored as JSON, at its path below the value. */
export interface JsonProblem {
  path: (string | number)[];
  message: string;
}

/**
 * Why a string cannot be stored: Postgres' jsonb and text refuse NUL, and an
 * unpaired UTF-16 surrogate has no UTF-8 encoding at all.
 */
function badString(s: string): string | undefined {
  if (s.includes("\0")) return "contains NUL (U+0000)";
  if (!s.isWellFormed()) return "contains an unpaired UTF-16 surrogate";
  return undefined;
}

interface Node {
  value: unknown;
  key: string | number | undefined;
  parent: Node | undefined;
  depth: number;
}

function pathOf(node: Node): (string | number)[] {
  const path: (string | number)[] = [];
  for (let n: Node | undefined = node; n?.parent; n = n.parent) path.push(n.key!);
  return path.reverse();
}

/**
 * Everything in `value` that poimen cannot store and return as it came (at
 * most `limit` problems): strings and object keys that `badString` refuses,
 * numbers that are not finite (`JSON.parse("1e400")` is Infinity, which
 * `JSON.stringify` silently turns into null), nesting deeper than
 * `maxDepth`, and values JSON has no form for. Iterative, so no input,
 * however deep, can overflow the stack.
 */
export function jsonProblems(
  value: unknown,
  maxDepth: number = MAX_JSON_DEPTH,
  limit: number = MAX_REPORTED,
): JsonProblem[] {
  const problems: JsonProblem[] = [];
  const stack: Node[] = [{ value, key: undefined, parent: undefined, depth: 0 }];
  const report = (node: Node, message: string, key?: string) => {
    const path = pathOf(node);
    if (key !== undefined) path.push(key);
    problems.push({ path, message });
  };
  while (stack.length > 0 && problems.length < limit) {
    const node = stack.pop()!;
    const v = node.value;
    switch (typeof v) {
      case "string": {
        const bad = badString(v);
        if (bad) report(node, bad);
        break;
      }
      case "number":
        if (!Number.isFinite(v)) report(node, "number outside the IEEE 754 double range");
        break;
      case "boolean":
      case "undefined":
        break;
      case "object": {
        if (v === null) break;
        const depth = node.depth + 1;
        if (depth > maxDepth) {
          report(node, `nested deeper than ${maxDepth} levels`);
          break;
        }
        // Pushed in reverse, so problems are reported in document order.
        if (Array.isArray(v)) {
          for (let i = v.length - 1; i >= 0; i--) {
            stack.push({ value: v[i], key: i, parent: node, depth });
          }
        } else {
          const keys = Object.keys(v);
          for (let i = keys.length - 1; i >= 0; i--) {
            const bad = badString(keys[i]);
            if (bad) report(node, `key ${bad}`, keys[i]);
            else {
              stack.push({
                value: (v as Record<string, unknown>)[keys[i]],
                key: keys[i],
                parent: node,
                depth,
              });
            }
          }
        }
        break;
      }
      default:
        report(node, `a ${typeof v} is not JSON`);
    }
  }
  return problems.slice(0, limit);
}

/**
 * A JSON value poimen can store and give back exactly: see `jsonProblems`.
 * Each problem is reported at its own path (`input.a.b[3]`).
 */
export const JsonValue = z.unknown().superRefine((value, ctx) => {
  for (const p of jsonProblems(value)) {
    ctx.addIssue({ code: "custom", path: p.path, message: p.message });
  }
});

/**
 * A field path for people: `input.a.b[3]`, `input["a key"]` (keys that are
 * not identifiers are JSON-quoted, so NUL and lone surrogates stay visible
 * and the path stays printable).
 */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const key of path) {
    if (typeof key === "number") out += `[${key}]`;
    else if (typeof key === "string" && /^[A-Za-z_][A-Za-z0-9_]*$/.test(key)) {
      out += out === "" ? key : `.${key}`;
    } else out += `[${JSON.stringify(String(key))}]`;
  }
  return out;
}
