/**
 * examples/billing as a user has it: copied to a folder outside the
 * repository, its deno.json linking `@poimen/poimen` to this checkout, it
 * type-checks, and its producer side (submit.ts, definitions.ts) loads no
 * handler and no worker code; its worker (`deno run` with the permissions
 * of its own `worker` task, in the copy) implements and hosts the
 * definitions against the real API and relay; its submit.ts starts runs
 * with the typed client over HTTP and over Kafka and both succeed with the
 * handlers' results; a bad input is a 422 naming the field. Then the
 * checkout's stock worker hosts the same worker.ts (`--workflows`). And the
 * published package holds every module its exports load (`links` does not
 * read `publish.include`, so only a dry run can tell).
 */
import assert from "node:assert/strict";
import { startBroker } from "../dev/kafka.ts";
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { tenantTopics } from "../contracts/topics.ts";
import { PoimenClient, type Run } from "../client/http.ts";
import { SECOND } from "../core/time.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, PoimenProcess, runCommand } from "./support/processes.ts";
import { BROKER, KAFKA_TEST } from "./support/kafka.ts";

const EXAMPLE = `${PROJECT_ROOT}examples/billing/`;
const LONG = 90 * SECOND;

await startBroker();

/** A copy of examples/billing outside the repository, linked to this checkout. */
async function copyProject(): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "poimen-billing-" });
  assert.ok(!dir.startsWith(PROJECT_ROOT), `${dir} is outside the checkout`);
  for await (const e of Deno.readDir(EXAMPLE)) {
    // What a run in the checkout left there is not the project's.
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

/** `deno run` of the project's task `name`: its flags and script, as deno.json has them. */
async function taskLine(dir: string, name: string): Promise<string[]> {
  const line: string = JSON.parse(await Deno.readTextFile(`${dir}/deno.json`)).tasks[name];
  const words = line.trim().split(/\s+/);
  assert.deepEqual(words.slice(0, 2), ["deno", "run"], `task ${name} is a plain deno run`);
  assert.ok(!words.includes("-A") && !words.includes("--allow-all"), `task ${name}: ${line}`);
  return words.slice(1);
}

/** A process of the copied project, started in its folder, stopped with a signal. */
class ProjectProcess {
  readonly #child: Deno.ChildProcess;
  readonly #log: string[] = [];
  readonly #collected: Promise<unknown>;
  readonly done: Promise<Deno.CommandStatus>;
  exited = false;

  constructor(cwd: string, args: string[], env: Record<string, string>) {
    this.#child = new Deno.Command(Deno.execPath(), {
      args,
      cwd,
      env: { NO_COLOR: "1", ...env },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#collected = Promise.all([
      this.#collect(this.#child.stdout),
      this.#collect(this.#child.stderr),
    ]);
    this.done = this.#child.status.then((s) => {
      this.exited = true;
      return s;
    });
  }

  async #collect(stream: ReadableStream<Uint8Array>) {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) this.#log.push(chunk);
  }

  logs(): string {
    return this.#log.join("");
  }

  /** SIGTERM, then SIGKILL after `timeoutMs`; resolves with the status once the output is read. */
  async stop(timeoutMs = 20_000): Promise<Deno.CommandStatus> {
    if (!this.exited) {
      try {
        this.#child.kill("SIGTERM");
      } catch { /* gone */ }
    }
    const timer = setTimeout(() => {
      try {
        this.#child.kill("SIGKILL");
      } catch { /* gone */ }
    }, timeoutMs);
    try {
      const status = await this.done;
      await this.#collected;
      return status;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** A database, a tenant with a token, and a ready API process on it. */
interface Stack {
  db: TestDatabase;
  tenant: string;
  token: string;
  api: ApiProcess;
  client: PoimenClient;
}

async function withStack(fn: (s: Stack) => Promise<void>) {
  const db = await freshDatabase();
  const tenant = `bill-${crypto.randomUUID().slice(0, 8)}`;
  let api: ApiProcess | undefined;
  try {
    const tok = await runCommand("token", [tenant], { DATABASE_URL: db.url, LOG_LEVEL: "warn" });
    assert.equal(tok.code, 0, tok.stderr);
    const token = tok.stdout.trim();
    api = await new ApiProcess({ DATABASE_URL: db.url }).ready();
    await fn({ db, tenant, token, api, client: new PoimenClient({ url: api.url, token }) });
    const status = await api.stop();
    assert.equal(status.code, 0, `api did not stop cleanly:\n${api.logs().join("\n")}`);
  } finally {
    await api?.stop("SIGKILL");
    await db.drop();
  }
}

/** Waits until the catalog holds both billing versions (a worker registered them). */
async function registered(db: TestDatabase, worker: { exited: boolean; logs(): string }) {
  const outcome = await waitFor("billing.invoice@1 and billing.refund@1 registered", async () => {
    // Returned, not thrown: waitFor retries what throws, and an exit is final.
    if (worker.exited) return "exited";
    const rows = await db.sql`
      select name from workflow_versions where name in ('billing.invoice', 'billing.refund')`;
    return rows.length === 2 && "registered";
  }, LONG);
  if (outcome === "exited") throw new Error(`worker exited:\n${worker.logs()}`);
}

function finished(client: PoimenClient, id: string): Promise<Run> {
  return waitFor(`run ${id} finished`, async () => {
    const run = await client.getRun(id);
    return run.status !== "queued" && run.status !== "running" && run;
  }, LONG);
}

Deno.test("examples billing: the copied project type-checks against the linked package; submit.ts loads no handler or worker code", async () => {
  const dir = await copyProject();
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["check", "definitions.ts", "worker.ts", "submit.ts"],
      cwd: dir,
      env: { NO_COLOR: "1" },
    }).output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    for (const producer of ["submit.ts", "definitions.ts"]) {
      const info = await new Deno.Command(Deno.execPath(), {
        args: ["info", "--json", producer],
        cwd: dir,
        env: { NO_COLOR: "1" },
      }).output();
      assert.equal(info.code, 0, new TextDecoder().decode(info.stderr));
      const modules = (JSON.parse(new TextDecoder().decode(info.stdout)) as {
        modules: { specifier: string }[];
      }).modules.map((m) => m.specifier);
      assert.ok(modules.some((m) => m.endsWith("/definitions.ts")), modules.join("\n"));
      const handlers = modules.filter((m) =>
        m === `file://${dir}/worker.ts` || m.startsWith(`file://${PROJECT_ROOT}worker/`)
      );
      assert.deepEqual(handlers, [], `${producer} loads the worker's code`);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "examples billing: its worker hosts its workflows; submit.ts admits over HTTP and Kafka",
  ...KAFKA_TEST,
  fn: () =>
    withStack(async ({ db, tenant, token, api, client }) => {
      const dir = await copyProject();
      const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
      let worker: ProjectProcess | undefined;
      let relay: PoimenProcess | undefined;
      let failed = true;
      try {
        await ensureTenantTopics(admin, tenant, {
          partitions: 1,
          replicationFactor: 1,
          retentionMs: 3_600_000,
        });
        const relayToken = await runCommand("token", ["--service", "relay"], {
          DATABASE_URL: db.url,
          LOG_LEVEL: "warn",
        });
        assert.equal(relayToken.code, 0, relayToken.stderr);
        relay = new PoimenProcess("relay", {
          KAFKA_BROKERS: BROKER,
          API_URL: api.url,
          RELAY_TOKEN: relayToken.stdout.trim(),
          RELAY_GROUP_ID: `poimen-test-relay-${tenant}`,
          // This test's tenant only: other tests' topics share the broker.
          RELAY_TENANT_PATTERN: tenant,
          RELAY_TOPIC_REFRESH_MS: "500",
          LOG_LEVEL: "warn",
        });
        worker = new ProjectProcess(dir, await taskLine(dir, "worker"), {
          DATABASE_URL: db.url,
          WORKER_METRICS_PORT: "0",
          WORKER_POLL_MS: "200",
        });
        await registered(db, worker);

        // A bad input is refused at admission, by the catalog's JSON Schema.
        const res = await fetch(`${api.url}/v1/runs`, {
          method: "POST",
          headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
          body: JSON.stringify({
            workflow_ref: "billing.invoice@1",
            input: { customer_id: "cus_1", amount_cents: -5, currency: "JPY" },
          }),
        });
        assert.equal(res.status, 422);
        assert.match(res.headers.get("content-type") ?? "", /^application\/problem\+json/);
        const problem = await res.json();
        const paths = (problem.errors as { path: string }[]).map((e) => e.path).sort();
        assert.deepEqual(paths, ["input.amount_cents", "input.currency"], JSON.stringify(problem));

        // What JSON Schema cannot say (the refund's refine) is admitted, then failed by the worker.
        const { run: unrefined } = await client.admitRun({
          workflow_ref: "billing.refund@1",
          input: { invoice_id: "inv_1", amount_cents: 100, reason: "other" },
        }, { idempotent: true });
        const rejected = await finished(client, unrefined.run_id);
        assert.equal(rejected.status, "failed");
        const error = rejected.error as { code: string; issues: { path: string }[] };
        assert.equal(error.code, "invalid-input");
        assert.deepEqual(error.issues.map((i) => i.path), ["note"]);

        const submit = await new Deno.Command(Deno.execPath(), {
          args: await taskLine(dir, "submit"),
          cwd: dir,
          env: {
            NO_COLOR: "1",
            API_URL: api.url,
            POIMEN_TOKEN: token,
            POIMEN_TENANT: tenant,
            KAFKA_BROKERS: BROKER,
          },
          stdin: "null",
        }).output();
        const dec = new TextDecoder();
        const said = `stdout:\n${dec.decode(submit.stdout)}\nstderr:\n${dec.decode(submit.stderr)}`;
        assert.equal(submit.code, 0, said);
        const [invoiced, refunded] = dec.decode(submit.stdout).trim().split("\n").map((l) =>
          JSON.parse(l)
        );
        assert.equal(invoiced.via, "http");
        assert.equal(invoiced.status, "succeeded");
        // 12 500 EUR cents and 20 % tax.
        assert.deepEqual(invoiced.result, {
          invoice_id: `inv_${invoiced.run_id}`,
          total_cents: 15_000,
          currency: "EUR",
        });
        assert.equal(refunded.via, "kafka");
        assert.equal(refunded.status, "succeeded");
        assert.deepEqual(refunded.result, {
          refund_id: `ref_${refunded.run_id}`,
          refunded_cents: 15_000,
        });
        // The refund came in through the relay, not over HTTP.
        const run = await client.getRun(refunded.run_id);
        assert.match(run.source, /^kafka:poimen\.bill-[0-9a-f]+\.dispatch\/0\/\d+$/);
        assert.deepEqual(run.input, {
          invoice_id: invoiced.result.invoice_id,
          amount_cents: 15_000,
          reason: "duplicate",
        });

        // Both processes stop gracefully on SIGTERM.
        const workerStatus = await worker.stop();
        assert.equal(workerStatus.code, 0, `worker did not stop cleanly:\n${worker.logs()}`);
        const relayStatus = await relay.stop();
        assert.equal(
          relayStatus.code,
          0,
          `relay did not stop cleanly:\n${relay.logs().join("\n")}`,
        );
        failed = false;
      } finally {
        if (failed) {
          console.error(`--- worker ---\n${worker?.logs()}`);
          console.error(`--- relay ---\n${relay?.logs().slice(-60).join("\n")}`);
        }
        await worker?.stop(1_000);
        await relay?.stop("SIGKILL");
        await admin.deleteTopics(tenantTopics(tenant)).catch(() => {});
        await admin.close();
        await Deno.remove(dir, { recursive: true });
      }
    }),
});

Deno.test("examples billing: the stock worker hosts worker.ts's implementations with --workflows", () =>
  withStack(async ({ db, client }) => {
    const dir = await copyProject();
    // The checkout's own task permissions (runFlags of `worker`), run from the checkout.
    const worker = new PoimenProcess("worker", {
      DATABASE_URL: db.url,
      // Bound by the worker itself: a port picked here could be taken before it binds it.
      WORKER_METRICS_PORT: "0",
      WORKER_POLL_MS: "200",
      LOG_LEVEL: "warn",
    }, ["--workflows", `${dir}/worker.ts`]);
    let failed = true;
    try {
      await registered(db, {
        get exited() {
          return worker.exited;
        },
        logs: () => worker.logs().join("\n"),
      });
      // admitRun, the untyped form, still takes any workflow_ref.
      const { run } = await client.admitRun({
        workflow_ref: "billing.invoice@1",
        input: { customer_id: "cus_7", amount_cents: 999, currency: "USD" },
      }, { idempotent: true });
      const done = await finished(client, run.run_id);
      assert.equal(done.status, "succeeded", JSON.stringify(done.error));
      assert.deepEqual(done.result, {
        invoice_id: `inv_${run.run_id}`,
        total_cents: 999,
        currency: "USD",
      });
      const status = await worker.stop();
      assert.equal(status.code, 0, `worker did not stop cleanly:\n${worker.logs().join("\n")}`);
      failed = false;
    } finally {
      if (failed) console.error(`--- worker ---\n${worker.logs().join("\n")}`);
      await worker.stop("SIGKILL");
      await Deno.remove(dir, { recursive: true });
    }
  }));

Deno.test("examples billing: the published package holds every module its exports load", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["publish", "--dry-run", "--allow-dirty"],
    cwd: PROJECT_ROOT,
    env: { NO_COLOR: "1" },
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.match(text, /Checking for slow types/, text);
  const problems = [...text.matchAll(/^(error|warning)\[([a-z-]+)\]/gm)].map((m) => m[2]);
  // The licence is the maintainers' to choose; everything else must pass.
  assert.deepEqual(problems.filter((p) => p !== "missing-license"), [], text);
});
