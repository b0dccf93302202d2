/**
 * The package as users get it (`deno add jsr:@poimen/poimen`): every module
 * an export's graph reaches is in `publish.include`, so the published
 * package runs what the checkout runs, and no exported module reads a file
 * relative to the checkout (migrations and console assets are modules).
 */
import assert from "node:assert/strict";
import { localModuleGraph } from "./support/module_graph.ts";

const ROOT = new URL("../", import.meta.url);
const config = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT))) as {
  exports: Record<string, string>;
  publish: { include: string[] };
};

function included(path: string): boolean {
  return config.publish.include.some((p) => p.endsWith("/") ? path.startsWith(p) : p === path);
}

for (const [name, entry] of Object.entries(config.exports)) {
  Deno.test(`package: export ${name} reaches only published modules, none reading checkout files`, async () => {
    const graph = await localModuleGraph(entry);
    assert.ok(graph.includes(entry.replace(/^\.\//, "")), `the graph was read: ${graph}`);
    assert.deepEqual(graph.filter((p) => !included(p)), [], "missing from publish.include");
    for (const path of graph.filter((p) => p.endsWith(".ts") || p.endsWith(".js"))) {
      const text = await Deno.readTextFile(new URL(path, ROOT));
      assert.doesNotMatch(
        text,
        /Deno\.(readTextFile|readFile|readDir)\(/,
        `${path} reads files: embed them as modules`,
      );
    }
  });
}

Deno.test("package: the exports users import are all there and documented (deno doc --lint)", async () => {
  assert.deepEqual(Object.keys(config.exports).sort(), [
    "./client",
    "./dispatch",
    "./events",
    "./migrate",
    "./worker",
    "./workflow",
  ]);
  // Together, as JSR lints the package, and each alone: a user importing one
  // export finds every type its API names exported from it.
  for (
    const entries of [
      Object.values(config.exports),
      ...Object.values(config.exports).map((e) => [e]),
    ]
  ) {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["doc", "--lint", ...entries],
      cwd: ROOT,
      env: { NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, `${entries.join(" ")}: ${text}`);
  }
});

Deno.test("package: it is publishable: deno publish --dry-run passes, LICENSE included, no warning", async () => {
  const root = new URL("../", import.meta.url);
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["publish", "--dry-run", "--allow-dirty", "--no-check"],
    cwd: root,
    env: { NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 0, text);
  assert.match(text, /Success Dry run complete/);
  assert.match(text, /\/LICENSE \(/, "the LICENSE file is in the package");
  assert.doesNotMatch(text, /warning/i, text);
  const config = JSON.parse(await Deno.readTextFile(new URL("deno.json", root)));
  assert.equal(config.license, "Apache-2.0");
});
