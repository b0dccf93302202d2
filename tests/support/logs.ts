/**
 * Negative log assertions that cannot pass by accident: "no line says X" is
 * only worth something while the code can still say X. `assertNotLogged`
 * first checks that X is a message the code logs — a string literal, or a
 * template literal whose fixed parts match, in a source file outside tests/ —
 * so a reworded message fails the test instead of passing it silently.
 */
import assert from "node:assert/strict";
import { PROJECT_ROOT } from "../../dev/tasks.ts";

const SKIP = new Set(["vendor", "tests", "node_modules", "bench", "docs", "migrations"]);

let literals: { exact: Set<string>; templates: RegExp[] } | undefined;

function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

function collect(dir: string, out: { exact: Set<string>; templates: RegExp[] }) {
  for (const e of Deno.readDirSync(`${PROJECT_ROOT}${dir}`)) {
    const path = dir ? `${dir}/${e.name}` : e.name;
    if (e.isDirectory) {
      if (!SKIP.has(path) && !e.name.startsWith(".")) collect(path, out);
      continue;
    }
    if (!/\.(ts|tsx)$/.test(e.name)) continue;
    const text = Deno.readTextFileSync(`${PROJECT_ROOT}${path}`);
    for (const m of text.matchAll(/"((?:[^"\\\n]|\\.)*)"/g)) out.exact.add(m[1]);
    for (const m of text.matchAll(/`((?:[^`\\]|\\.)*)`/g)) {
      if (!m[1].includes("${")) out.exact.add(m[1]);
      else {
        // A placeholder stands for one word (a phase, a count); a template
        // with little fixed text (`${what}: ${why}`) would match anything.
        const parts = m[1].split(/\$\{[^}]*\}/);
        if (parts.join("").replace(/\W/g, "").length < 12) continue;
        out.templates.push(new RegExp(`^${parts.map(escape).join("\\S+")}$`));
      }
    }
  }
}

/** Whether the code (outside tests/) has `msg` as a literal it could log. */
export function isLoggedByCode(msg: string): boolean {
  if (!literals) collect("", literals = { exact: new Set(), templates: [] });
  return literals.exact.has(msg) || literals.templates.some((t) => t.test(msg));
}

/**
 * Asserts that none of `lines` (JSON log lines) has message `msg`, after
 * asserting that the code does log `msg` somewhere.
 */
export function assertNotLogged(lines: readonly string[], msg: string, why = ""): void {
  assert.ok(
    isLoggedByCode(msg),
    `no code logs ${JSON.stringify(msg)} any more: update this test's message`,
  );
  const fragment = `"msg":${JSON.stringify(msg)}`;
  const found = lines.filter((l) => l.includes(fragment));
  assert.deepEqual(found, [], `${JSON.stringify(msg)} was logged${why ? ` (${why})` : ""}`);
}
