/**
 * Postgres connection kills, with real processes (API, worker, outbox) on a
 * database of this file's own and the shared development broker: while
 * callers keep admitting runs, every backend of the database is terminated
 * over and over for a few seconds (what `deno task chaos` does; the shared
 * cluster itself is never restarted). No process may exit, each must serve
 * again once the kills stop, and nothing is lost: every run a caller was told
 * exists is executed, and its events reach Kafka. And none of it was the
 * process guard's doing (db/driver_guard.ts): every lost connection reached a
 * caller, none was left for the guard to contain.
 *
 *   deno test -A tests/it_postgres_kill_test.ts
 */
import assert from "node:assert/strict";
import { startBroker } from "../dev/kafka.ts";
import { eventsTopic } from "../contracts/topics.ts";
import { parseEventMessage } from "../contracts/events.ts";
import { SECOND } from "../core/time.ts";
import { createPool } from "../db/pool.ts";
import { ADMIN_URL, freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, PoimenProcess, runCommand, sampleValue } from "./support/processes.ts";
import { BROKER, consume, KAFKA_TEST } from "./support/kafka.ts";

const LONG = 60 * SECOND;
const KILL_MS = 3 * SECOND;
const CALLERS = 6;

await startBroker();

Deno.test({
  name: "postgres kills: api, worker and outbox stay up, recover, and lose no run or event",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const tenant = `pk-${crypto.randomUUID().slice(0, 8)}`;
    const tok = await runCommand("token", [tenant], { DATABASE_URL: db.url });
    assert.equal(tok.code, 0, tok.stderr);
    const token = tok.stdout.trim();
    const env = { DATABASE_URL: db.url, KAFKA_BROKERS: BROKER, LOG_LEVEL: "warn" };
    const api = new ApiProcess(env);
    const worker = new PoimenProcess("worker", {
      ...env,
      WORKER_CONCURRENCY: "4",
      WORKER_POLL_MS: "100",
      // A run whose attempt lost its lease to the kills is taken again soon.
      WORKER_LEASE_MS: String(10 * SECOND),
    });
    const outbox = new PoimenProcess("outbox", { ...env, OUTBOX_POLL_MS: "100" });
    const procs = [api, worker, outbox];
    const { got, consumer } = consume(eventsTopic(tenant));
    // The test's own pool is left alone by the kills: only the processes' are under test.
    const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test-killer" });
    const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };

    // Each caller admits its keys one by one, retrying a key until the API
    // says the run exists (a 503 during the kills, a reset connection…), as
    // a well-behaved client would.
    const admitted = new Map<string, string>(); // dispatch key → run id
    let calling = true;
    const caller = async (c: number) => {
      for (let i = 0; calling; i++) {
        const key = `k-${c}-${i}`;
        while (true) {
          try {
            const res = await fetch(`${api.url}/v1/runs`, {
              method: "POST",
              headers,
              body: JSON.stringify({ workflow_ref: "echo", input: { c, i }, dispatch_key: key }),
            });
            const body = await res.json();
            if (res.status === 201 || res.status === 200) {
              admitted.set(key, body.run_id);
              break;
            }
            assert.ok(res.status >= 500, `${key}: ${res.status} ${JSON.stringify(body)}`);
          } catch (err) {
            if (err instanceof assert.AssertionError) throw err;
          }
          if (procs.some((p) => p.exited)) return;
          await new Promise((r) => setTimeout(r, 20));
        }
      }
    };
    const exits = () =>
      procs.filter((p) => p.exited).map((p) => `${p.command} exited:\n${p.logs().join("\n")}`);

    let callers: Promise<void>[] = [];
    try {
      await api.ready();
      callers = [...Array(CALLERS).keys()].map(caller);
      await waitFor("runs flowing before the kills", async () => {
        const [{ n }] = await db.sql<{ n: number }[]>`
          select count(*)::int as n from runs where status = 'succeeded'`;
        return n >= 10;
      }, LONG);

      let killed = 0;
      const until = Date.now() + KILL_MS;
      while (Date.now() < until) {
        const [row] = await admin<{ n: number }[]>`
          select count(*) filter (where pg_terminate_backend(pid))::int as n
            from pg_stat_activity
           where datname = ${db.name} and pid <> pg_backend_pid()
             and application_name <> 'poimen-test'`;
        killed += row.n;
        await new Promise((r) => setTimeout(r, Math.random() * 40));
      }
      assert.ok(killed > 20, `only ${killed} backends terminated`);
      assert.deepEqual(exits(), [], "a process died of the kills");

      // Recovered: ready again, admitting, executing, shipping.
      await waitFor("api ready after the kills", async () => {
        const res = await fetch(`${api.url}/readyz`);
        await res.body?.cancel();
        return res.status === 200;
      }, LONG);
      const before = admitted.size;
      await waitFor("admissions after the kills", () => admitted.size >= before + 20, LONG);
      calling = false;
      await Promise.all(callers);
      assert.deepEqual(exits(), [], "a process died after the kills");

      const res = await fetch(`${api.url}/v1/runs`, {
        method: "POST",
        headers,
        body: JSON.stringify({ workflow_ref: "echo", input: { last: true } }),
      });
      assert.equal(res.status, 201);
      const last = (await res.json()).run_id as string;
      const runIds = new Set([...admitted.values(), last]);

      // Nothing lost: one run per key, every run executed, all its events on Kafka.
      const [{ n }] = await db.sql<{ n: number }[]>`select count(*)::int as n from runs`;
      assert.equal(n, runIds.size, "one run per admitted key (and the last one)");
      await waitFor("every run succeeded", async () => {
        const [{ pending }] = await db.sql<{ pending: number }[]>`
          select count(*)::int as pending from runs where status <> 'succeeded'`;
        return pending === 0;
      }, LONG);
      // Gap-free from run.admitted to run.succeeded (an attempt cut short by
      // a kill may add a retry in between); redelivered duplicates allowed.
      const complete = (events: Map<number, string> | undefined) => {
        if (!events || events.get(1) !== "run.admitted") return false;
        const last = Math.max(...events.keys());
        return events.get(last) === "run.succeeded" && events.size === last;
      };
      await waitFor("every run's events on Kafka", () => {
        const seen = new Map<string, Map<number, string>>();
        for (const m of got) {
          const e = parseEventMessage(m.value);
          if (!seen.has(e.run_id)) seen.set(e.run_id, new Map());
          seen.get(e.run_id)!.set(e.seq, e.type);
        }
        return [...runIds].every((id) => complete(seen.get(id)));
      }, LONG);
      assert.deepEqual(exits(), []);

      // The guard only hides what the patched driver should never raise:
      // a count above 0 is a driver regression, even with every process up.
      for (const p of procs) {
        const url = p === api ? api.url : p.metricsUrl;
        const text = await (await fetch(`${url}/metrics`)).text();
        assert.match(
          text,
          /^# TYPE poimen_db_driver_faults_total counter$/m,
          `${p.command}: the driver guard is installed`,
        );
        for (const kind of ["rejection", "exception"]) {
          assert.equal(
            sampleValue(text, "poimen_db_driver_faults_total", { kind }),
            0,
            `${p.command} contained driver faults (${kind}):\n${p.logs().join("\n")}`,
          );
        }
      }
    } finally {
      calling = false;
      await Promise.all(callers).catch(() => {});
      await consumer.close();
      await admin.end();
      const statuses = await Promise.all(procs.map((p) => p.stop()));
      await db.drop();
      for (const [i, s] of statuses.entries()) {
        assert.equal(
          s.code,
          0,
          `${procs[i].command} did not stop cleanly:\n${procs[i].logs().join("\n")}`,
        );
      }
    }
  },
});
