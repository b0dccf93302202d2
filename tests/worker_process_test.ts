/**
 * The stock worker process (`deno task worker --workflows <module>`, with
 * the task's own permissions) confines a team's handlers: they cannot read
 * the worker's environment (DATABASE_URL and its password) nor any file
 * outside the module's folder and node_modules, and only a local module is
 * loaded at all.
 */
import assert from "node:assert/strict";
import { freshDatabase, laneQueuedRuns, waitFor } from "./support/db.ts";
import { PoimenProcess, runCommand, runFlags } from "./support/processes.ts";

const TENANT = "acme";
// Trust authentication ignores it; a handler that could read DATABASE_URL would return it.
const PASSWORD = "hunter2-never-leaves";

const HOSTILE = `
import { z } from "zod";
import { defineWorkflow } from "@poimen/poimen/workflow";
export const steal = defineWorkflow({
  name: "team.steal",
  version: 1,
  maxAttempts: 1,
  input: z.object({ what: z.enum(["env", "environ", "passwd", "own"]) }),
  handler: async ({ what }) => {
    switch (what) {
      case "env": return { env: Deno.env.get("DATABASE_URL") ?? Deno.env.toObject() };
      case "environ": return { environ: await Deno.readTextFile("/proc/self/environ") };
      case "passwd": return { passwd: await Deno.readTextFile("/etc/passwd") };
      case "own": return { own: await Deno.readTextFile(new URL("./own.txt", import.meta.url)) };
    }
  },
});
`;

Deno.test("worker process: a --workflows module's handlers cannot read the worker's environment (DATABASE_URL), /proc/self/environ or /etc/passwd: each run fails with a permission error; files of the module's own folder stay readable", async () => {
  const db = await freshDatabase();
  const dir = await Deno.makeTempDir({ prefix: "poimen-hostile-" });
  await Deno.writeTextFile(`${dir}/workflows.ts`, HOSTILE);
  await Deno.writeTextFile(`${dir}/own.txt`, "the module's own data");
  const url = new URL(db.url);
  url.password = PASSWORD;
  const worker = new PoimenProcess("worker", {
    DATABASE_URL: url.href,
    LOG_LEVEL: "warn",
    WORKER_POLL_MS: "50",
  }, ["--workflows", `${dir}/workflows.ts`]);
  try {
    await db.sql`insert into tenants (tenant_id) values (${TENANT})`;
    const ids = new Map<string, string>();
    for (const what of ["env", "environ", "passwd", "own"]) {
      const [{ run_id }] = await db.sql<{ run_id: string }[]>`
        insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                          source, max_attempts)
        values (${TENANT}, gen_random_uuid(), 'team.steal', 'team.steal', 1,
                ${db.sql.json({ what })}, 'test', 1)
        returning run_id`;
      ids.set(what, run_id);
    }
    await laneQueuedRuns(db.sql, TENANT);
    const rows = await waitFor("every run ended", async () => {
      if (worker.exited) throw new Error(`worker exited:\n${worker.logs().join("\n")}`);
      const rows = await db.sql<
        { run_id: string; status: string; result: unknown; error: unknown }[]
      >`
        select run_id, status, result, error from runs
         where run_id = any (${[...ids.values()]}::uuid[])
           and status in ('succeeded', 'failed')`;
      return rows.length === ids.size ? rows : undefined;
    }, 30_000);
    const byWhat = new Map(
      [...ids].map(([what, id]) => [what, rows.find((r) => r.run_id === id)!]),
    );
    for (const what of ["env", "environ", "passwd"]) {
      const run = byWhat.get(what)!;
      const shown = JSON.stringify(run);
      assert.equal(run.status, "failed", `${what}: ${shown}`);
      assert.equal(run.result, null, `${what}: ${shown}`);
      assert.match(shown, /NotCapable|Requires (env|read) access/, `${what}: ${shown}`);
      assert.ok(!shown.includes(PASSWORD), `${what}: ${shown}`);
      assert.ok(!shown.includes("root:"), `${what}: ${shown}`);
    }
    const own = byWhat.get("own")!;
    assert.equal(own.status, "succeeded", JSON.stringify(own));
    assert.deepEqual(own.result, { own: "the module's own data" });
    const logs = worker.logs().join("\n");
    assert.ok(!logs.includes(PASSWORD), logs);
    const stopped = await worker.stop();
    assert.equal(stopped.code, 0, worker.logs().join("\n"));
  } finally {
    await worker.stop();
    await Deno.remove(dir, { recursive: true });
    await db.drop();
  }
});

Deno.test("worker process: --workflows loads only a local module: an https:, npm: or data: specifier is refused with one line and exit 2", async () => {
  for (
    const specifier of [
      "https://example.com/workflows.ts",
      "npm:zod",
      "data:text/javascript,export const x = 1;",
    ]
  ) {
    const out = await runCommand(
      "worker",
      ["--workflows", specifier],
      { DATABASE_URL: "postgres://postgres@127.0.0.1:1/none" },
      runFlags("worker"),
    );
    assert.equal(out.code, 2, `${specifier}: ${out.stderr}`);
    const lines = out.stderr.split("\n").filter((l) => l.trim() !== "");
    assert.equal(lines.length, 1, `${specifier}: ${out.stderr}`);
    assert.match(lines[0], /--workflows .*: only a local module can be loaded/);
  }
});

/** The processes whose parent is `pid` (from /proc), those not yet reaped. */
async function childrenOf(pid: number): Promise<number[]> {
  const found: number[] = [];
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const stat = await Deno.readTextFile(`/proc/${entry.name}/stat`);
      // pid (comm) state ppid ...: comm may hold spaces, so read after its ")".
      const [state, ppid] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(ppid) === pid && state !== "Z") found.push(Number(entry.name));
    } catch { /* gone meanwhile */ }
  }
  return found;
}

function alive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] !== "Z";
  } catch {
    return false;
  }
}

Deno.test("worker process: a --workflows worker killed with SIGKILL leaves no confined worker behind: the process it started exits when its parent is gone", async () => {
  const db = await freshDatabase();
  const dir = await Deno.makeTempDir({ prefix: "poimen-orphan-" });
  await Deno.writeTextFile(
    `${dir}/workflows.ts`,
    `import { z } from "zod";
import { defineWorkflow } from "@poimen/poimen/workflow";
export const hello = defineWorkflow({
  name: "team.hello",
  version: 1,
  input: z.object({}),
  handler: () => ({ hello: true }),
});
`,
  );
  const worker = new PoimenProcess("worker", {
    DATABASE_URL: db.url,
    LOG_LEVEL: "warn",
    WORKER_POLL_MS: "50",
  }, ["--workflows", `${dir}/workflows.ts`]);
  let confined: number[] = [];
  try {
    await db.sql`insert into tenants (tenant_id) values (${TENANT})`;
    await db.sql`
      insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                        source, max_attempts)
      values (${TENANT}, gen_random_uuid(), 'team.hello', 'team.hello', 1, '{}', 'test', 1)`;
    await laneQueuedRuns(db.sql, TENANT);
    // The confined worker is up and claiming: it ran the run.
    await waitFor("the run succeeded", async () => {
      if (worker.exited) throw new Error(`worker exited:\n${worker.logs().join("\n")}`);
      const [{ n }] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from runs where status = 'succeeded'`;
      return n === 1 || undefined;
    }, 30_000);
    confined = await childrenOf(worker.pid);
    assert.equal(confined.length, 1, `the worker's children: ${confined}`);
    await worker.stop("SIGKILL");
    await waitFor("the confined worker exited", () => !alive(confined[0]) || undefined, 15_000);
  } finally {
    await worker.stop();
    for (const pid of confined) {
      try {
        if (alive(pid)) Deno.kill(pid, "SIGKILL");
      } catch { /* gone */ }
    }
    await Deno.remove(dir, { recursive: true });
    await db.drop();
  }
});
