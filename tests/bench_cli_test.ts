/**
 * The bench tasks read their arguments as the `main.ts` commands do: `--help`
 * prints the usage on stdout and exits 0, a usage mistake is one line on
 * stderr and exit code 2, both before any work. Run as a user runs them,
 * through `deno task`, so the task's own argument passing (a `--` forwarded
 * as an argument) is part of what is tested.
 */
import assert from "node:assert/strict";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { benchArgs } from "../bench/bench.ts";
import { BenchContext, DEFAULT_SOAK_RUNS } from "../bench/run_context.ts";

const TASKS = ["bench", "bench:relay", "bench:growth"];

async function task(name: string, args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["task", name, ...args],
    cwd: PROJECT_ROOT,
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  // deno task's own first line on stderr, "Task <name> <command>": not the script's.
  const stderr = dec.decode(out.stderr).split("\n").filter((l) => !l.startsWith("Task ")).join(
    "\n",
  );
  return { code: out.code, stdout: dec.decode(out.stdout), stderr };
}

function oneLine(stderr: string): string {
  const lines = stderr.trim().split("\n");
  assert.equal(lines.length, 1, `expected one line on stderr, got:\n${stderr}`);
  return lines[0];
}

for (const name of TASKS) {
  Deno.test(`bench cli: deno task ${name} --help prints its usage on stdout and exits 0`, async () => {
    const out = await task(name, ["--help"]);
    assert.equal(out.code, 0, out.stderr);
    assert.equal(out.stderr.trim(), "");
    assert.match(out.stdout, new RegExp(`^usage: ${name} `));
    assert.match(out.stdout, /^options:$/m);
    assert.match(out.stdout, /^ {2}-h, --help /m);
    assert.match(out.stdout, /^ {2}BENCH_ADMIN_URL /m);
  });

  Deno.test(`bench cli: deno task ${name} -- --help (deno task forwards the --) prints its usage`, async () => {
    const out = await task(name, ["--", "--help"]);
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stdout, new RegExp(`^usage: ${name} `));
  });

  Deno.test(`bench cli: deno task ${name} --bogus says so in one line on stderr and exits 2`, async () => {
    const out = await task(name, ["--bogus"]);
    assert.equal(out.code, 2);
    assert.equal(out.stdout, "");
    assert.equal(oneLine(out.stderr), `${name}: unknown option '--bogus' (see '${name} --help')`);
  });
}

Deno.test("bench cli: a bad flag value is one line and exit 2, for each task", async () => {
  for (
    const [name, args, message] of [
      ["bench", ["--only", "http,gpu"], "bench: --only: no section 'gpu' (sections: "],
      ["bench", ["--soak-runs", "10M"], "bench: --soak-runs must be a whole number ≥ 1"],
      ["bench:relay", ["--rounds", "two"], "bench:relay: --rounds must be a whole number ≥ 1"],
      ["bench:growth", ["--sizes", "0,50"], "bench:growth: --sizes: 0 or whole numbers above"],
    ] as const
  ) {
    const out = await task(name, [...args]);
    assert.equal(out.code, 2, `${name}: ${out.stderr}`);
    assert.equal(out.stdout, "");
    assert.ok(oneLine(out.stderr).startsWith(message), out.stderr);
  }
});

/** Collects what benchArgs prints. */
function capture() {
  const lines = { out: [] as string[], err: [] as string[] };
  return {
    lines,
    output: { out: (l: string) => lines.out.push(l), err: (l: string) => lines.err.push(l) },
  };
}

Deno.test("bench cli: the documented invocations parse to what they always meant", () => {
  const cases: [string[], boolean, string[] | undefined][] = [
    [[], false, undefined],
    [["--quick"], true, undefined],
    [["--", "--quick"], true, undefined],
    [["--", "--only", "worker,relay"], false, ["worker", "relay"]],
    [["--", "--quick", "--", "--only", "http,growth,worker,relay"], true, [
      "http",
      "growth",
      "worker",
      "relay",
    ]],
    [["--only=growth"], false, ["growth"]],
    [["--", "--only", "wait"], false, ["wait"]],
  ];
  for (const [argv, quick, only] of cases) {
    const { lines, output } = capture();
    const args = benchArgs(argv, output);
    assert.notEqual(typeof args, "number", `${argv.join(" ")}: ${lines.err.join("\n")}`);
    if (typeof args === "number") continue;
    assert.equal(args.quick, quick, argv.join(" "));
    assert.deepEqual(args.only && [...args.only], only, argv.join(" "));
    assert.deepEqual(lines, { out: [], err: [] });
  }
});

Deno.test("bench cli: a positional argument or a missing --only value is a usage mistake", () => {
  for (const argv of [["quick"], ["--only"], ["--only", ""]]) {
    const { lines, output } = capture();
    assert.equal(benchArgs(argv, output), 2, argv.join(" "));
    assert.equal(lines.err.length, 1, argv.join(" "));
    assert.deepEqual(lines.out, []);
  }
});

Deno.test("bench cli: each issue-28 section runs alone with --only, its sizes from its flags", () => {
  const { lines, output } = capture();
  const args = benchArgs([
    "--",
    "--only",
    "spread,idle,claim,soak",
    "--soak-runs",
    "10000000",
    "--spread-runs",
    "200",
    "--tenants",
    "1,20",
    "--idle-groups",
    "0,20",
    "--claim-queued",
    "2000",
  ], output);
  assert.deepEqual(lines, { out: [], err: [] });
  assert.notEqual(typeof args, "number");
  if (typeof args === "number") return;
  assert.deepEqual([...args.only!], ["spread", "idle", "claim", "soak"]);
  assert.deepEqual(args.shape, {
    soakRuns: 10_000_000,
    spreadRuns: 200,
    tenants: [1, 20],
    idleGroups: [0, 20],
    claimQueued: 2000,
  });
  for (const section of ["spread", "idle", "claim", "soak"]) {
    const alone = benchArgs(["--only", section], output);
    assert.notEqual(typeof alone, "number", section);
    if (typeof alone !== "number") assert.deepEqual([...alone.only!], [section]);
  }
});

Deno.test("bench cli: without size flags the run keeps its defaults, 10,000 tenants and 1M queued", () => {
  const args = benchArgs([], capture().output);
  assert.notEqual(typeof args, "number");
  if (typeof args === "number") return;
  assert.deepEqual(args.shape, {});
  const full = new BenchContext({ quick: false, adminUrl: "", wrk: "", pgbench: "" }).cfg.shape;
  assert.deepEqual(full.tenants, [1, 200, 2_000, 10_000]);
  assert.deepEqual(full.idleGroups, [0, 1_000, 10_000]);
  assert.equal(full.claimQueued, 1_000_000);
  assert.equal(full.soakRuns, DEFAULT_SOAK_RUNS);
  const set = new BenchContext({
    quick: true,
    adminUrl: "",
    wrk: "",
    pgbench: "",
    shape: { soakRuns: 10_000_000, tenants: [1, 20] },
  }).cfg.shape;
  assert.equal(set.soakRuns, 10_000_000);
  assert.deepEqual(set.tenants, [1, 20]);
  assert.equal(set.spreadRuns, 2_000, "--quick's size where no flag set one");
});

Deno.test("bench cli: a bad size is one usage line naming its flag", () => {
  for (
    const [argv, message] of [
      [["--soak-runs", "0"], "bench: --soak-runs must be a whole number ≥ 1"],
      [["--soak-runs", "1e7"], "bench: --soak-runs must be a whole number ≥ 1"],
      [["--spread-runs", "2.5"], "bench: --spread-runs must be a whole number ≥ 1"],
      [["--tenants", "1,x"], "bench: --tenants: whole numbers ≥ 1, comma-separated"],
      [["--tenants", "0,20"], "bench: --tenants: whole numbers ≥ 1, comma-separated"],
      [["--tenants", "200,20"], "bench: --tenants: ascending, each once"],
      [["--idle-groups", "0,1000,1000"], "bench: --idle-groups: ascending, each once"],
      [["--claim-queued", "50"], "bench: --claim-queued must be a whole number ≥ 100"],
      [["--soak-runs"], "bench: "],
    ] as const
  ) {
    const { lines, output } = capture();
    assert.equal(benchArgs([...argv], output), 2, argv.join(" "));
    assert.equal(lines.err.length, 1, argv.join(" "));
    assert.ok(lines.err[0].startsWith(message), `${argv.join(" ")}: ${lines.err[0]}`);
    assert.deepEqual(lines.out, []);
  }
});
