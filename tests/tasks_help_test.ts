/**
 * Every task of deno.json answers `--help` with its usage (stdout, exit 0)
 * and an unknown option with one line (stderr, exit 2) — before doing any
 * work. The list is read from deno.json, so a new task cannot forget.
 */
import assert from "node:assert/strict";
import { PROJECT_ROOT } from "../dev/tasks.ts";

const TASKS = Object.keys(
  JSON.parse(Deno.readTextFileSync(`${PROJECT_ROOT}deno.json`)).tasks as Record<string, string>,
);

async function task(name: string, ...args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["task", "-q", name, ...args],
    cwd: PROJECT_ROOT,
    env: { NO_COLOR: "1" },
    stdin: "null",
    signal: AbortSignal.timeout(60_000),
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

Deno.test("tasks: deno.json has the tasks the README promises", () => {
  for (const name of ["up", "test", "api", "worker", "outbox", "relay", "bench", "chaos", "ok"]) {
    assert.ok(TASKS.includes(name), `no task ${name}`);
  }
});

for (const name of TASKS) {
  Deno.test(`tasks: deno task ${name} answers --help with its usage, and an unknown option with one line`, async () => {
    const help = await task(name, "--help");
    assert.equal(help.code, 0, `--help exited ${help.code}:\n${help.stdout}\n${help.stderr}`);
    assert.match(help.stdout, /^usage: /m, help.stdout);
    assert.equal(help.stderr.trim(), "", help.stderr);

    const wrong = await task(name, "--no-such-option");
    assert.equal(wrong.code, 2, `exited ${wrong.code}:\n${wrong.stdout}\n${wrong.stderr}`);
    const lines = wrong.stderr.trim().split("\n");
    assert.equal(lines.length, 1, `more than one line:\n${wrong.stderr}`);
    assert.match(lines[0], /--no-such-option/);
    assert.equal(wrong.stdout.trim(), "", wrong.stdout);
  });
}
