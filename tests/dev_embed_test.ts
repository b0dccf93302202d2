/**
 * The embedded migrations and console files (dev/embed.ts) are what is on
 * disk: a migration or console file changed without `deno task embed` fails
 * here, since the code serves and applies only the embedded copies.
 */
import assert from "node:assert/strict";
import {
  EMBED_TASK,
  embeddedModules,
  readMigrationFiles,
  renderConsoleAssets,
  renderMigrations,
  templateLiteral,
} from "../dev/embed.ts";
import { loadMigrations } from "../db/migrate.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";

const ROOT = new URL(`file://${PROJECT_ROOT}`);

/** Evaluates a generated module without writing it anywhere. */
async function evaluate(text: string): Promise<Record<string, unknown>> {
  const b64 = btoa(String.fromCharCode(...new TextEncoder().encode(text)));
  return await import(`data:application/typescript;base64,${b64}`);
}

Deno.test("embed: the embedded modules are the files on disk (else run `deno task embed`)", async () => {
  const modules = await embeddedModules();
  assert.deepEqual(modules.map((m) => m.path), [
    "migrations/embedded.ts",
    "api/console/static/embedded.ts",
  ]);
  for (const module of modules) {
    const onDisk = await Deno.readTextFile(new URL(module.path, ROOT));
    assert.ok(
      onDisk === module.text,
      `${module.path} is out of date with the files it embeds: run \`${EMBED_TASK}\``,
    );
  }
});

Deno.test("embed: the code loads exactly the migrations and console files on disk", async () => {
  const files = await readMigrationFiles(new URL("migrations/", ROOT));
  assert.ok(files.length >= 7, `only ${files.length} migrations found`);
  assert.deepEqual(
    loadMigrations(),
    files,
    `the embedded migrations differ from migrations/*.sql: run \`${EMBED_TASK}\``,
  );
  const assets = loadConsoleAssets();
  for (const [name, embedded] of [["app.js", assets.appJs], ["console.css", assets.css]]) {
    const path = `api/console/static/${name}`;
    assert.ok(
      embedded === await Deno.readTextFile(new URL(path, ROOT)),
      `${path} differs from its embedded copy: run \`${EMBED_TASK}\``,
    );
  }
});

Deno.test("embed: a changed file changes the generated module, so a stale one is caught", () => {
  const migrations = loadMigrations();
  const changed = migrations.map((m, i) => i === 0 ? { ...m, sql: `${m.sql}-- changed\n` } : m);
  assert.notEqual(renderMigrations(changed), renderMigrations(migrations));
  const assets = loadConsoleAssets();
  assert.notEqual(
    renderConsoleAssets({ ...assets, css: `${assets.css} ` }),
    renderConsoleAssets(assets),
  );
});

Deno.test("embed: any text survives the round trip through the generated module", async () => {
  const tricky = "a `tick` ${not.interpolated} \\n backslash\r\nCRLF \\` \\${ end\\";
  assert.equal((await evaluate(`export const s: string = ${templateLiteral(tricky)};`)).s, tricky);
  const module = await evaluate(renderConsoleAssets({ appJs: tricky, css: `\n${tricky}\n` }));
  assert.equal(module.appJs, tricky);
  assert.equal(module.css, `\n${tricky}\n`);
});

Deno.test("embed: the generated modules are deno fmt-clean and lint-clean as generated", async () => {
  const tmp = await Deno.makeTempDir();
  try {
    const long = `${"x".repeat(150)}\n`;
    const texts = [
      ...(await embeddedModules()).map((m) => m.text),
      renderConsoleAssets({ appJs: long, css: long }),
    ];
    const paths = [];
    for (const [i, text] of texts.entries()) {
      const path = `${tmp}/generated_${i}.ts`;
      await Deno.writeTextFile(path, text);
      paths.push(path);
    }
    for (const args of [["fmt", "--check", "--line-width=100"], ["lint"]]) {
      const out = await new Deno.Command(Deno.execPath(), {
        args: [...args, "--no-config", ...paths],
        stdin: "null",
      }).output();
      const dec = new TextDecoder();
      assert.equal(
        out.code,
        0,
        `deno ${args[0]}:\n${dec.decode(out.stdout)}${dec.decode(out.stderr)}`,
      );
    }
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
});
