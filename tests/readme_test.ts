/**
 * The README says what the code does: every environment variable the code
 * reads is in its configuration table, every metric the code registers is in
 * its metrics section, and every `deno task` it names exists.
 */
import assert from "node:assert/strict";

const ROOT = new URL("../", import.meta.url);
// The code that ships: processes, tools and the local tooling (not tests or the bench).
const CODE_DIRS = [
  "admission",
  "api",
  "cli",
  "contracts",
  "core",
  "db",
  "dev",
  "kafka",
  "outbox",
  "relay",
  "retention",
  "worker",
  "workflows",
];

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
  for (const d of CODE_DIRS) {
    try {
      await walk(new URL(`${d}/`, ROOT), `${d}/`);
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
    }
  }
  out.set("main.ts", await Deno.readTextFile(new URL("main.ts", ROOT)));
  return out;
}

/** The text of the README section under `## title`, up to the next `## `. */
function section(readme: string, title: string): string {
  const start = readme.indexOf(`\n## ${title}\n`);
  assert.ok(start >= 0, `README has a "## ${title}" section`);
  const end = readme.indexOf("\n## ", start + 1);
  return readme.slice(start, end < 0 ? undefined : end);
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

Deno.test("README: every environment variable the code reads is in the configuration table", async () => {
  const files = await sourceFiles();
  const vars = envVariables(files);
  // The scan itself must find the variables it is meant to find.
  for (const known of ["DATABASE_URL", "RELAY_TOKEN", "WORKER_CONCURRENCY", "OUTBOX_BATCH_SIZE"]) {
    assert.ok(vars.has(known), `the scan finds ${known}`);
  }
  const table = section(await Deno.readTextFile(new URL("README.md", ROOT)), "Configuration");
  const missing = [...vars].filter((v) => !table.includes(`\`${v}\``)).sort();
  assert.deepEqual(missing, [], `variables read by the code but missing from README: ${missing}`);
});

Deno.test("README: every metric the code registers is in the metrics section", async () => {
  const files = await sourceFiles();
  const metrics = new Set<string>();
  for (const text of files.values()) {
    for (const m of text.matchAll(/name:\s*"(poimen_[a-z0-9_]+)"/g)) metrics.add(m[1]);
  }
  assert.ok(metrics.size >= 10, `the scan finds the metrics (${metrics.size})`);
  const text = section(await Deno.readTextFile(new URL("README.md", ROOT)), "Metrics");
  const missing = [...metrics].filter((m) => !new RegExp(`\\b${m}\\b`).test(text)).sort();
  assert.deepEqual(missing, [], `metrics missing from README: ${missing}`);
});

Deno.test("README: every `deno task` it names exists in deno.json", async () => {
  const readme = await Deno.readTextFile(new URL("README.md", ROOT));
  const tasks = Object.keys(
    JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT))).tasks as Record<string, string>,
  );
  const named = new Set(
    [...readme.matchAll(/deno task (?:-q )?([a-z][a-z0-9:_-]*)/g)].map((m) => m[1]),
  );
  assert.ok(named.has("up") && named.has("test"), "README names the two commands");
  const unknown = [...named].filter((t) => !tasks.includes(t)).sort();
  assert.deepEqual(unknown, [], `tasks named in README but not in deno.json: ${unknown}`);
});
