/**
 * The README and docs/ say what the code does: every environment variable the
 * code reads is in docs/configuration.md, every metric the code registers is
 * in docs/metrics.md, every error code is in docs/api.md's problems, every
 * `deno task` they name exists and every task of deno.json is named.
 * (Links and the README's length: docs_links_test.ts.)
 */
import assert from "node:assert/strict";
import { ERRORS } from "../core/errors.ts";
import { docFiles, ROOT, section } from "./support/markdown.ts";

// The code that ships is every top-level folder but these: the tests, the
// bench, the vendored driver and what is not TypeScript of ours. Listing what
// to skip rather than what to read keeps a new module (say retention/) in.
const NOT_CODE = new Set(["tests", "bench", "vendor", "node_modules", "docs", "migrations"]);

async function codeDirs(): Promise<string[]> {
  const dirs: string[] = [];
  for await (const e of Deno.readDir(ROOT)) {
    if (e.isDirectory && !e.name.startsWith(".") && !NOT_CODE.has(e.name)) dirs.push(e.name);
  }
  return dirs.sort();
}

async function sourceFiles(): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  async function walk(dir: URL, rel: string) {
    for await (const e of Deno.readDir(dir)) {
      if (e.isDirectory) await walk(new URL(`${e.name}/`, dir), `${rel}${e.name}/`);
      else if (e.name.endsWith(".ts") || e.name.endsWith(".tsx")) {
        out.set(rel + e.name, await Deno.readTextFile(new URL(e.name, dir)));
      }
    }
  }
  const dirs = await codeDirs();
  for (const known of ["api", "core", "relay", "worker"]) {
    assert.ok(dirs.includes(known), `the code's folders were found: ${dirs}`);
  }
  for (const d of dirs) await walk(new URL(`${d}/`, ROOT), `${d}/`);
  out.set("main.ts", await Deno.readTextFile(new URL("main.ts", ROOT)));
  return out;
}

/**
 * Variables the code reads: keys of the zod environment schemas (an upper-case
 * key with an underscore, or one of the few single words) and `Deno.env.get`.
 */
export function envVariables(files: Map<string, string>): Set<string> {
  const names = new Set<string>();
  for (const text of files.values()) {
    for (const m of text.matchAll(/^\s+([A-Z][A-Z0-9]*_[A-Z0-9_]+|PORT|HOST)\??:/gm)) {
      names.add(m[1]);
    }
    for (const m of text.matchAll(/Deno\.env\.get\(\s*"([A-Z][A-Z0-9_]*)"\s*\)/g)) names.add(m[1]);
  }
  return names;
}

async function doc(path: string): Promise<string> {
  return await Deno.readTextFile(new URL(path, ROOT));
}

Deno.test("docs: every environment variable the code reads is in docs/configuration.md", async () => {
  const files = await sourceFiles();
  const vars = envVariables(files);
  // The scan itself must find the variables it is meant to find.
  for (const known of ["DATABASE_URL", "RELAY_TOKEN", "WORKER_CONCURRENCY", "OUTBOX_BATCH_SIZE"]) {
    assert.ok(vars.has(known), `the scan finds ${known}`);
  }
  const text = await doc("docs/configuration.md");
  const missing = [...vars].filter((v) => !text.includes(`\`${v}\``)).sort();
  assert.deepEqual(
    missing,
    [],
    `variables read by the code but missing from docs/configuration.md: ${missing}`,
  );
});

Deno.test("docs: every metric the code registers is in docs/metrics.md", async () => {
  const files = await sourceFiles();
  const metrics = new Set<string>();
  for (const text of files.values()) {
    for (const m of text.matchAll(/name:\s*"(poimen_[a-z0-9_]+)"/g)) metrics.add(m[1]);
  }
  assert.ok(metrics.size >= 10, `the scan finds the metrics (${metrics.size})`);
  const text = await doc("docs/metrics.md");
  const missing = [...metrics].filter((m) => !new RegExp(`\\b${m}\\b`).test(text)).sort();
  assert.deepEqual(missing, [], `metrics missing from docs/metrics.md: ${missing}`);
});

Deno.test("docs: every error code of the one error table is in docs/api.md's problems", async () => {
  const codes = Object.keys(ERRORS);
  assert.ok(codes.includes("validation") && codes.includes("busy"), `the table was read: ${codes}`);
  const text = section(await doc("docs/api.md"), "Problems");
  const missing = codes.filter((c) => !text.includes(`\`${c}\``)).sort();
  assert.deepEqual(missing, [], `error codes missing from docs/api.md#problems: ${missing}`);
});

Deno.test("docs: every `deno task` named exists in deno.json, and every task is named", async () => {
  const tasks = Object.keys(
    JSON.parse(await doc("deno.json")).tasks as Record<string, string>,
  );
  const named = new Map<string, string>();
  for (const { path, text } of await docFiles()) {
    for (const m of text.matchAll(/deno task (?:-q )?([a-z][a-z0-9:_-]*)/g)) {
      if (!named.has(m[1])) named.set(m[1], path);
    }
  }
  const readme = await doc("README.md");
  assert.ok(
    /deno task up\b/.test(readme) && /deno task test\b/.test(readme),
    "README names the two commands",
  );
  const unknown = [...named].filter(([t]) => !tasks.includes(t)).map(([t, p]) => `${t} (${p})`);
  assert.deepEqual(unknown, [], `tasks named in the docs but not in deno.json: ${unknown}`);
  const unnamed = tasks.filter((t) => !named.has(t)).sort();
  assert.deepEqual(unnamed, [], `tasks of deno.json the README and docs/ never name: ${unnamed}`);
});
