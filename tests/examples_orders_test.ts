/**
 * examples/orders as a user has it: copied outside the repository, its
 * deno.json linking `@poimen/poimen` to this checkout, it type-checks; its
 * worker (`deno task worker`'s line, in the copy) hosts `shop.order@1`
 * against a real API; its submit.ts places an order, sees it charged and
 * waiting (suspended) for its approval, approves it with a signal, and the
 * order ships after its cool-off (a suspended sleep), each step once.
 */
import assert from "node:assert/strict";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { SECOND } from "../core/time.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, runCommand } from "./support/processes.ts";

const EXAMPLE = `${PROJECT_ROOT}examples/orders/`;
const LONG = 90 * SECOND;

/** A copy of examples/orders outside the repository, linked to this checkout. */
async function copyProject(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "poimen-orders-" });
  assert.ok(!dir.startsWith(PROJECT_ROOT), `${dir} is outside the checkout`);
  for await (const e of Deno.readDir(EXAMPLE)) {
    if (e.isFile && e.name !== "deno.lock") {
      await Deno.copyFile(EXAMPLE + e.name, `${dir}/${e.name}`);
    }
  }
  const config = JSON.parse(await Deno.readTextFile(`${dir}/deno.json`));
  assert.deepEqual(config.links, ["../.."], "the example links the checkout it sits in");
  config.links = [PROJECT_ROOT.replace(/\/$/, "")];
  await Deno.writeTextFile(`${dir}/deno.json`, JSON.stringify(config, null, 2));
  return dir;
}

/** `deno run` of the project's task `name`, as its deno.json has it (no `-A`). */
async function taskLine(dir: string, name: string): Promise<string[]> {
  const line: string = JSON.parse(await Deno.readTextFile(`${dir}/deno.json`)).tasks[name];
  const words = line.trim().split(/\s+/);
  assert.deepEqual(words.slice(0, 2), ["deno", "run"], `task ${name} is a plain deno run`);
  assert.ok(!words.includes("-A") && !words.includes("--allow-all"), `task ${name}: ${line}`);
  return words.slice(1);
}

Deno.test("examples orders: the copied project type-checks against the linked package", async () => {
  const dir = await copyProject();
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["check", "workflows.ts", "worker.ts", "submit.ts"],
      cwd: dir,
      env: { NO_COLOR: "1" },
    }).output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("examples orders: an order is charged, waits for its approval, is approved by a signal, cools off and ships", async () => {
  const db: TestDatabase = await freshDatabase();
  const dir = await copyProject();
  let api: ApiProcess | undefined;
  let worker: Deno.ChildProcess | undefined;
  let workerLog: Promise<string> | undefined;
  try {
    const tok = await runCommand("token", ["shop"], { DATABASE_URL: db.url, LOG_LEVEL: "warn" });
    assert.equal(tok.code, 0, tok.stderr);
    api = await new ApiProcess({ DATABASE_URL: db.url }).ready();
    worker = new Deno.Command(Deno.execPath(), {
      args: await taskLine(dir, "worker"),
      cwd: dir,
      env: {
        NO_COLOR: "1",
        DATABASE_URL: db.url,
        WORKER_METRICS_PORT: "0",
        WORKER_POLL_MS: "200",
        LOG_LEVEL: "warn",
      },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    workerLog = new Response(worker.stderr).text();
    await waitFor("shop.order@1 registered", async () => {
      const rows = await db.sql`select 1 from workflow_versions where name = 'shop.order'`;
      return rows.length === 1;
    }, LONG);
    const submit = await new Deno.Command(Deno.execPath(), {
      args: await taskLine(dir, "submit"),
      cwd: dir,
      env: {
        NO_COLOR: "1",
        API_URL: api.url,
        POIMEN_TOKEN: tok.stdout.trim(),
        ORDER_ID: "o-77",
        COOL_OFF_MS: "6000",
      },
      stdin: "null",
    }).output();
    const dec = new TextDecoder();
    const said = `stdout:\n${dec.decode(submit.stdout)}\nstderr:\n${dec.decode(submit.stderr)}`;
    assert.equal(submit.code, 0, said);
    const [placed, waiting, finished] = dec.decode(submit.stdout).trim().split("\n").map((l) =>
      JSON.parse(l)
    );
    assert.equal(placed.stage, "placed");
    assert.equal(waiting.status, "waiting", said);
    assert.deepEqual(waiting.waiting_for.name, "approval");
    assert.deepEqual(waiting.steps, ["charge:completed", "approval:waiting"]);
    assert.equal(finished.status, "succeeded", said);
    const key = (step: string) => `shop:${placed.run_id}:${step}`.slice(-12);
    assert.deepEqual(finished.result, {
      order_id: "o-77",
      status: "shipped",
      approved_by: "alice",
      charged: { charge_id: `ch_${key("charge")}`, order_id: "o-77", cents: 4200 },
      shipped: { shipment_id: `sh_${key("ship")}`, order_id: "o-77" },
    });
    assert.deepEqual(finished.steps, [
      "charge:completed",
      "approval:completed",
      "cool-off:completed",
      "ship:completed",
    ]);
    // Suspended twice (the approval, the cool-off), never an attempt spent.
    const types = await db.sql<{ type: string }[]>`
      select type from work_events where run_id = ${placed.run_id} order by seq`;
    assert.equal(types.filter((t) => t.type === "run.waiting").length, 2);
    const [{ attempts }] = await db.sql<{ attempts: number }[]>`
      select attempts from runs where run_id = ${placed.run_id}`;
    assert.equal(attempts, 1);
  } finally {
    try {
      worker?.kill("SIGTERM");
    } catch { /* gone */ }
    const status = await worker?.status;
    const log = await workerLog;
    await api?.stop();
    await Deno.remove(dir, { recursive: true });
    await db.drop();
    if (status) assert.equal(status.code, 0, `worker:\n${log}`);
  }
});
