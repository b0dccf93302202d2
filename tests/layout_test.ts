/**
 * The house's rooms stay small: no source file of ours (outside vendor/ and
 * tests/) is over 450 lines. A file that grows past it has more than one job;
 * split it by responsibility, into files whose names say their job.
 */
import assert from "node:assert/strict";
import { PROJECT_ROOT } from "../dev/tasks.ts";

const MAX_LINES = 450;
const SKIP = new Set(["vendor", "tests", "node_modules", ".git", ".kafka", "docs", "migrations"]);
const SOURCE = /\.(ts|tsx|js|mjs)$/;

async function* sourceFiles(dir: string): AsyncGenerator<string> {
  for await (const e of Deno.readDir(`${PROJECT_ROOT}${dir}`)) {
    const path = dir ? `${dir}/${e.name}` : e.name;
    if (e.isDirectory) {
      // bench/.deps and bench/out hold other projects' code and outputs.
      if (!SKIP.has(path) && !e.name.startsWith(".") && path !== "bench/out") {
        yield* sourceFiles(path);
      }
    } else if (SOURCE.test(e.name)) yield path;
  }
}

Deno.test("layout: no source file outside vendor/ and tests/ is over 450 lines", async () => {
  const over: string[] = [];
  let files = 0;
  for await (const path of sourceFiles("")) {
    files++;
    const lines = (await Deno.readTextFile(`${PROJECT_ROOT}${path}`)).split("\n").length - 1;
    if (lines > MAX_LINES) over.push(`${path}: ${lines} lines`);
  }
  assert.ok(files > 50, `only ${files} source files found`);
  assert.deepEqual(over, [], `split these by responsibility:\n${over.join("\n")}`);
});
