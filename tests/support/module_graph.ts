/** What a module imports, as `deno info --json` reads it. */
import assert from "node:assert/strict";

const ROOT = new URL("../../", import.meta.url);

/** The checkout's files (paths relative to it) in `entry`'s module graph. */
export async function localModuleGraph(entry: string): Promise<string[]> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", entry],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  const graph = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    modules: { specifier: string }[];
  };
  return graph.modules.map((m) => m.specifier).filter((s) => s.startsWith(ROOT.href))
    .map((s) => s.slice(ROOT.href.length));
}
