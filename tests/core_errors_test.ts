/**
 * One error table: every code poimen writes anywhere — thrown as a
 * `PoimenError` (checked by the compiler) or written by SQL into a run's
 * error — is a row of `ERRORS`, with its status and `retryable` flag.
 */
import assert from "node:assert/strict";
import { ERRORS, PoimenError } from "../core/errors.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";

async function* sources(dir: string): AsyncGenerator<[string, string]> {
  for await (const e of Deno.readDir(`${PROJECT_ROOT}${dir}`)) {
    const path = `${dir}/${e.name}`;
    if (e.isDirectory) yield* sources(path);
    else if (/\.(ts|tsx|sql)$/.test(e.name)) {
      yield [path, await Deno.readTextFile(`${PROJECT_ROOT}${path}`)];
    }
  }
}

Deno.test("errors: every code the SQL writes into a run's error is in the one table", async () => {
  const written: string[] = [];
  for (const dir of ["db", "migrations", "worker", "retention", "outbox"]) {
    for await (const [path, text] of sources(dir)) {
      for (const m of text.matchAll(/'code',\s*'([a-z][a-z0-9-]*)'/g)) {
        written.push(`${path}: ${m[1]}`);
      }
    }
  }
  assert.ok(written.some((w) => w.endsWith(": lease-expired")), written.join("\n"));
  const unknown = written.filter((w) => !Object.hasOwn(ERRORS, w.split(": ")[1]));
  assert.deepEqual(unknown, []);
});

Deno.test("errors: a PoimenError carries its code's status and retryable flag", () => {
  for (const [code, kind] of Object.entries(ERRORS)) {
    const err = new PoimenError(code as keyof typeof ERRORS, "x");
    assert.equal(err.status, kind.status, code);
    assert.equal(err.retryable, kind.retryable, code);
  }
  assert.equal(ERRORS["lease-expired"].retryable, false, "the attempts are spent");
});
