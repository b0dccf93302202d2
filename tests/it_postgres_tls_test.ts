/**
 * Postgres over TLS, for every process: with `sslmode=verify-full` in
 * DATABASE_URL and the server's CA in Deno's own `DENO_CERT`, the
 * commands (migrate, token) and the long-running processes (api, worker,
 * outbox) connect encrypted and verified, and a run goes through; a CA
 * that did not sign the server is refused with one line; a libpq-style
 * `sslrootcert=<file>` is a configuration error naming DATABASE_URL.
 */
import assert from "node:assert/strict";
import { freshDatabase, registerBuiltins, waitFor } from "./support/db.ts";
import { ensurePostgresTls } from "./support/pg_tls.ts";
import { ApiProcess, PoimenProcess, runCommand, runFlags } from "./support/processes.ts";

function verifiedUrl(url: string, extra = "sslmode=verify-full"): string {
  const u = new URL(url);
  // The certificate names localhost (and 127.0.0.1); verify-full checks the name.
  u.hostname = "localhost";
  return `${u.href}${u.search ? "&" : "?"}${extra}`;
}

Deno.test("postgres tls: every process connects with sslmode=verify-full and a run goes through", async () => {
  const tls = await ensurePostgresTls();
  const db = await freshDatabase(false);
  const url = verifiedUrl(db.url);
  const env = { DATABASE_URL: url, DENO_CERT: tls.caFile, LOG_LEVEL: "warn" };
  const processes: PoimenProcess[] = [];
  try {
    const migrated = await runCommand("migrate", [], env, runFlags("migrate"));
    assert.equal(migrated.code, 0, migrated.stderr);
    // migrate registers no workflow: echo is admitted before the worker registered it.
    await registerBuiltins(db.sql);
    const token = await runCommand("token", ["acme"], env, runFlags("token"));
    assert.equal(token.code, 0, token.stderr);
    const api = new ApiProcess(env);
    processes.push(api, new PoimenProcess("worker", { ...env, WORKER_POLL_MS: "50" }));
    processes.push(new PoimenProcess("outbox", env));
    await api.ready();
    const res = await fetch(`${api.url}/v1/runs`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${token.stdout.trim()}`,
        "content-type": "application/json",
        prefer: "wait=20",
      },
      body: JSON.stringify({ workflow_ref: "echo", input: { over: "tls" } }),
    });
    const run = await res.json();
    assert.equal(run.status, "succeeded", JSON.stringify(run));

    // Every session of the processes is encrypted; none is plaintext.
    const sessions = await waitFor("the outbox connected too", async () => {
      const rows = await db.sql<{ application_name: string; ssl: boolean }[]>`
        select a.application_name, s.ssl
          from pg_stat_activity a join pg_stat_ssl s on s.pid = a.pid
         where a.datname = ${db.name} and a.application_name like 'poimen-%'
           and a.application_name <> 'poimen-test'`;
      const kinds = new Set(rows.map((r) => r.application_name.split(/[ -]/)[1]));
      return ["api", "worker", "outbox"].every((k) => kinds.has(k)) ? rows : undefined;
    }, 20_000);
    assert.deepEqual(
      sessions.filter((s) => !s.ssl).map((s) => s.application_name),
      [],
      "plaintext sessions",
    );
  } finally {
    for (const p of processes) await p.stop();
    await db.drop();
  }
});

Deno.test("postgres tls: a CA that did not sign the server is refused with one line, and sslrootcert=<file> is a configuration error naming DATABASE_URL", async () => {
  const tls = await ensurePostgresTls();
  const db = await freshDatabase(false);
  try {
    const wrong = await runCommand("migrate", [], {
      DATABASE_URL: verifiedUrl(db.url),
      DENO_CERT: tls.otherCaFile,
      LOG_LEVEL: "warn",
    }, runFlags("migrate"));
    assert.equal(wrong.code, 1);
    const lines = wrong.stderr.trim().split("\n");
    assert.equal(lines.length, 1, wrong.stderr);
    assert.match(lines[0], /certificate/i);

    const libpq = await runCommand("migrate", [], {
      DATABASE_URL: verifiedUrl(db.url, `sslmode=verify-full&sslrootcert=${tls.caFile}`),
      LOG_LEVEL: "warn",
    }, runFlags("migrate"));
    assert.equal(libpq.code, 2);
    assert.match(libpq.stderr.trim(), /^config: DATABASE_URL is invalid: sslrootcert .*DENO_CERT/);
    assert.equal(libpq.stderr.trim().split("\n").length, 1);
  } finally {
    await db.drop();
  }
});
