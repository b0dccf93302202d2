/**
 * Kafka security against a real secured broker of this test's own
 * (dev/kafka_secured.ts: SASL_SSL with SCRAM and PLAIN, mTLS on a second
 * listener): `topics`, `dispatch`, the relay and the outbox, each run with
 * its deno.json task's permissions, carry a dispatch message to a run and
 * its events to `poimen.<tenant>.events`, every one of them over SASL_SSL;
 * a wrong password and a wrong CA are one line and exit 1 from a command,
 * retried by the relay; the password is in no output and no /metrics.
 *
 *   deno task test tests/it_kafka_security_test.ts
 */
import assert from "node:assert/strict";
import { startBroker } from "../dev/kafka.ts";
import { securedProcessEnv } from "../dev/kafka_secured.ts";
import { parseEventMessage } from "../contracts/events.ts";
import { eventsTopic } from "../contracts/topics.ts";
import { SECOND } from "../core/time.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, PoimenProcess, runCommand, runFlags } from "./support/processes.ts";
import { consume, KAFKA_TEST, privateBroker, type SecuredBroker } from "./support/kafka.ts";

const LONG = 90 * SECOND;

// The jars of the shared broker's folder, which the private one uses.
await startBroker();

/** `main.ts <command>` with the permissions of its deno.json task (or `flags`). */
function cli(command: string, args: string[], env: Record<string, string>, flags?: string[]) {
  return runCommand(command, args, { LOG_LEVEL: "warn", ...env }, flags ?? runFlags(command));
}

/** The environment of a SASL_SSL client of `broker` with `mechanism`. */
function saslEnv(broker: SecuredBroker, mechanism = "SCRAM-SHA-512"): Record<string, string> {
  return { ...securedProcessEnv(broker.address, broker.material), KAFKA_SASL_MECHANISM: mechanism };
}

/** The one stderr line of a failed command, checked to hold no secret. */
function oneLine(out: { code: number; stdout: string; stderr: string }, secret: string): string {
  assert.equal(out.code, 1, `${out.stdout}\n${out.stderr}`);
  const lines = out.stderr.trim().split("\n");
  assert.equal(lines.length, 1, `one line, got:\n${out.stderr}`);
  assert.ok(!out.stderr.includes(secret) && !out.stdout.includes(secret), "the password printed");
  return lines[0];
}

Deno.test({
  name:
    "kafka_security: every Kafka client of poimen works over SASL_SSL and TLS, and fails clearly",
  ...KAFKA_TEST,
  async fn(t) {
    await using broker = await privateBroker({ secured: true });
    const password = broker.material.password;
    const tenant = `ks-${crypto.randomUUID().slice(0, 8)}`;

    await t.step("topics declares over SASL_SSL with each mechanism", async () => {
      for (const mechanism of ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]) {
        const out = await cli("topics", [tenant], saslEnv(broker, mechanism));
        assert.equal(out.code, 0, out.stderr);
        assert.match(out.stdout, new RegExp(`poimen\\.${tenant}\\.dispatch$`, "m"));
      }
    });

    await t.step(
      "a dispatch message becomes a run whose events reach the events topic",
      async () => {
        const db = await freshDatabase();
        const processes: PoimenProcess[] = [];
        let failed = true;
        try {
          const token = await cli("token", ["--service", "relay"], { DATABASE_URL: db.url });
          assert.equal(token.code, 0, token.stderr);
          assert.equal((await cli("token", [tenant], { DATABASE_URL: db.url })).code, 0);
          const api = new ApiProcess({ DATABASE_URL: db.url });
          processes.push(api);
          await api.ready();
          const relay = new PoimenProcess("relay", {
            ...saslEnv(broker, "SCRAM-SHA-512"),
            API_URL: api.url,
            RELAY_TOKEN: token.stdout.trim(),
            RELAY_GROUP_ID: `ks-relay-${tenant}`,
            RELAY_TENANT_PATTERN: tenant,
            RELAY_TOPIC_REFRESH_MS: "500",
          });
          const outbox = new PoimenProcess("outbox", {
            ...saslEnv(broker, "SCRAM-SHA-256"),
            DATABASE_URL: db.url,
          });
          processes.push(relay, outbox);

          const sent = await cli("dispatch", [
            tenant,
            JSON.stringify({ workflow_ref: "echo", input: { n: 1 }, dispatch_key: "secured" }),
          ], saslEnv(broker, "SCRAM-SHA-512"));
          assert.equal(sent.code, 0, sent.stderr);
          assert.match(sent.stdout, new RegExp(`^poimen\\.${tenant}\\.dispatch \\d+ 0\\n$`));

          const [run] = await waitFor("the run admitted", async () => {
            for (const p of processes) if (p.exited) throw new Error(p.logs().join("\n"));
            const rows = await db.sql`
            select run_id from runs where tenant_id = ${tenant} and dispatch_key = 'secured'`;
            return rows.length === 1 ? rows : undefined;
          }, LONG);

          const events = consume(eventsTopic(tenant), broker.address, broker.security);
          try {
            const admitted = await waitFor("its run.admitted event published", () => {
              return events.got.map((m) => parseEventMessage(m.value)).find((e) =>
                e.run_id === run.run_id && e.type === "run.admitted"
              );
            }, LONG);
            assert.equal(admitted.dispatch_key, "secured");
          } finally {
            await events.consumer.close();
          }

          for (const p of [relay, outbox]) {
            const metrics = await (await fetch(`${p.metricsUrl}/metrics`)).text();
            assert.ok(!metrics.includes(password), `${p.command}'s /metrics holds the password`);
            const ready = await fetch(`${p.metricsUrl}/readyz`);
            await ready.body?.cancel();
            assert.equal(ready.status, 200, `${p.command} not ready:\n${p.logs().join("\n")}`);
          }
          for (const p of [relay, outbox]) {
            assert.equal((await p.stop()).code, 0, p.logs().join("\n"));
          }
          for (const p of processes) {
            assert.ok(!p.logs().join("\n").includes(password), `${p.command} logged the password`);
          }
          failed = false;
        } finally {
          for (const p of processes) {
            if (failed) console.error(`--- ${p.command} ---\n${p.logs().slice(-40).join("\n")}`);
            await p.stop("SIGKILL");
          }
          await db.drop();
        }
      },
    );

    await t.step("a wrong password: one line and exit 1 from topics and dispatch", async () => {
      const wrong = "not-the-password-1234";
      const env = { ...saslEnv(broker), KAFKA_SASL_PASSWORD: wrong };
      const topics = oneLine(await cli("topics", [tenant], env), wrong);
      assert.match(topics, /^topics: kafka admin \w+: SASL authentication failed\.$/);
      assert.ok(!topics.includes(password));
      const body = JSON.stringify({ workflow_ref: "echo", input: {} });
      const dispatch = oneLine(await cli("dispatch", [tenant, body], env), wrong);
      assert.match(dispatch, /^dispatch: kafka produce: SASL authentication failed\.$/);
    });

    await t.step("a wrong password: the relay retries as in an outage, and says so", async () => {
      const wrong = "not-the-password-5678";
      const relay = new PoimenProcess("relay", {
        ...saslEnv(broker),
        KAFKA_SASL_PASSWORD: wrong,
        RELAY_TOKEN: "unused",
        RELAY_GROUP_ID: `ks-wrong-${tenant}`,
        RELAY_TENANT_PATTERN: tenant,
        LOG_LEVEL: "info",
      });
      try {
        await waitFor("a logged authentication failure", () => {
          if (relay.exited) throw new Error(`the relay exited:\n${relay.logs().join("\n")}`);
          return relay.logs().some((l) => l.includes("SASL authentication failed"));
        }, LONG);
        const ready = await fetch(`${relay.metricsUrl}/readyz`);
        await ready.body?.cancel();
        assert.equal(ready.status, 503);
        assert.ok(!relay.exited, "the relay gave up");
        assert.ok(!relay.logs().join("\n").includes(wrong), "the relay logged the password");
      } finally {
        await relay.stop();
      }
    });

    await t.step("a wrong CA: one line and exit 1, naming what to check", async () => {
      const env = { ...saslEnv(broker), DENO_CERT: broker.material.otherCaPem };
      const topics = oneLine(await cli("topics", [tenant], env), password);
      assert.match(
        topics,
        /^topics: kafka admin \w+: .*certificate.* \(the broker's TLS certificate is not trusted: is KAFKA_SSL_CA_FILE, or DENO_CERT, its CA\?\)$/,
      );
      // The producer retries a handshake failure, a bounded number of times for the command.
      const body = JSON.stringify({ workflow_ref: "echo", input: {} });
      const dispatch = oneLine(await cli("dispatch", [tenant, body], env), password);
      assert.match(dispatch, /^dispatch: kafka produce: .*certificate.*not trusted/);
      // No CA at all: the system's CAs do not know a private one.
      const { DENO_CERT: _, ...noCa } = saslEnv(broker);
      assert.match(oneLine(await cli("topics", [tenant], noCa), password), /not trusted/);
    });

    await t.step(
      "a broker reached under a name its certificate does not hold is refused",
      async () => {
        // The same broker behind a TCP relay on 127.0.0.2: the right CA, the
        // right password, a certificate for localhost and 127.0.0.1 only.
        const listener = Deno.listen({ hostname: "127.0.0.2", port: 0 });
        const [host, port] = broker.address.split(":");
        const piping = (async () => {
          for await (const conn of listener) {
            Deno.connect({ hostname: host, port: Number(port) }).then(async (upstream) => {
              await Promise.allSettled([
                conn.readable.pipeTo(upstream.writable),
                upstream.readable.pipeTo(conn.writable),
              ]);
            }).catch(() => conn.close());
          }
        })();
        try {
          const env = { ...saslEnv(broker), KAFKA_BROKERS: `127.0.0.2:${listener.addr.port}` };
          const line = oneLine(await cli("topics", [tenant], env), password);
          assert.match(line, /^topics: kafka admin \w+: .*(altnames|does not match)/i);
        } finally {
          listener.close();
          await piping.catch(() => {});
        }
      },
    );

    await t.step(
      "KAFKA_SSL_CA_FILE and a client certificate (mTLS) on the SSL listener",
      async () => {
        const m = broker.material;
        const mtls = {
          KAFKA_BROKERS: broker.sslAddress,
          KAFKA_SECURITY_PROTOCOL: "SSL",
          KAFKA_SSL_CA_FILE: m.caPem,
          KAFKA_SSL_CERT_FILE: m.clientCertPem,
          KAFKA_SSL_KEY_FILE: m.clientKeyPem,
        };
        // Read at start-up: this needs read permission on the files (here: all).
        const ok = await cli("topics", [tenant], mtls, [
          "--allow-net",
          "--allow-env",
          "--allow-read",
        ]);
        assert.equal(ok.code, 0, ok.stderr);
        assert.match(ok.stdout, /^exists {2}poimen\./m);
        // The task's own permissions do not reach a file outside /etc/poimen: a config error.
        const denied = await cli("topics", [tenant], mtls);
        assert.equal(denied.code, 2, denied.stderr);
        assert.match(
          denied.stderr.trim(),
          /^config: KAFKA_SSL_CA_FILE is invalid: cannot read .*: not allowed to read it/,
        );
        // Without a certificate the listener refuses the connection.
        const { KAFKA_SSL_CERT_FILE: _c, KAFKA_SSL_KEY_FILE: _k, ...noCert } = mtls;
        const refused = await cli("topics", [tenant], noCert, ["--allow-all"]);
        assert.equal(refused.code, 1, refused.stderr);
        assert.ok(!refused.stderr.includes("PRIVATE KEY"));
      },
    );
  },
});
