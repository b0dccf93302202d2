/**
 * `init` readies an installation and can run before every start: the first
 * run migrates, creates tenants and topics and mints the relay's token into
 * RELAY_TOKEN_FILE; later runs reuse that token (re-registering it when the
 * database lost it) instead of minting a new one.
 */
import assert from "node:assert/strict";
import { freshDatabase } from "./support/db.ts";
import { ApiProcess, runCommand, runFlags } from "./support/processes.ts";
import { BROKER, KAFKA_TEST } from "./support/kafka.ts";
import { createAdmin } from "../kafka/admin.ts";
import { tenantTopics } from "../contracts/topics.ts";
import { HEADERS } from "../contracts/runs.ts";

/** The init task's flags, with its state directory moved to `dir`. */
function initPermissions(dir: string): string[] {
  return runFlags("init").map((p) => p.replaceAll("/var/lib/poimen", dir));
}

Deno.test({
  name: "init: a second run reuses the relay token it minted, and registers it again after a reset",
  ...KAFKA_TEST,
  fn: async () => {
    const db = await freshDatabase(false);
    const dir = await Deno.makeTempDir({ prefix: "poimen-init-" });
    const run = crypto.randomUUID().slice(0, 8);
    const tenants = [`init-${run}-a`, `init-${run}-b`];
    const file = `${dir}/relay_token`;
    const env = {
      DATABASE_URL: db.url,
      KAFKA_BROKERS: BROKER,
      TOPIC_PARTITIONS: "1",
      POIMEN_TENANTS: ` ${tenants[0]},${tenants[1]} `,
      RELAY_TOKEN_FILE: file,
      LOG_LEVEL: "info",
    };
    const init = async () => {
      const out = await runCommand("init", [], env, initPermissions(dir));
      assert.equal(out.code, 0, out.stderr + out.stdout);
      return out;
    };
    const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
    let api: ApiProcess | undefined;
    try {
      const first = await init();
      const token = (await Deno.readTextFile(file)).trim();
      assert.match(token, /^pmn_/);
      assert.equal((await Deno.stat(file)).mode! & 0o777, 0o600);
      assert.ok(!(first.stdout + first.stderr).includes(token), "the token is never printed");

      const tenantRows = await db.sql`select tenant_id from tenants order by tenant_id`;
      assert.deepEqual(tenantRows.map((r) => r.tenant_id), tenants);
      const topics = await admin.listTopics();
      for (const t of tenants.flatMap(tenantTopics)) assert.ok(topics.includes(t), t);

      const second = await init();
      assert.equal((await Deno.readTextFile(file)).trim(), token, "the same token");
      assert.match(second.stdout + second.stderr, /relay token already registered/);
      const [{ n }] = await db.sql`select count(*)::int as n from api_tokens`;
      assert.equal(n, 1, "no second token");

      // The database is reset; the file is not (another volume).
      await db.sql`delete from api_tokens`;
      await init();
      assert.equal((await Deno.readTextFile(file)).trim(), token);

      // The kept token is what the relay presents: the API accepts it for a tenant.
      api = await new ApiProcess({ DATABASE_URL: db.url }).ready();
      const res = await fetch(`${api.url}/v1/runs`, {
        headers: { authorization: `Bearer ${token}`, [HEADERS.tenant]: tenants[0] },
      });
      assert.equal(res.status, 200, await res.text());
    } finally {
      await api?.stop();
      try {
        await admin.deleteTopics(tenants.flatMap(tenantTopics));
      } finally {
        await admin.close();
      }
      await Deno.remove(dir, { recursive: true });
      await db.drop();
    }
  },
});

Deno.test("init: a bad tenant list is refused in one line naming POIMEN_TENANTS, exit 2", async () => {
  const out = await runCommand(
    "init",
    [],
    { POIMEN_TENANTS: "acme,Not A Tenant", DATABASE_URL: "postgres://postgres@127.0.0.1:1/x" },
    runFlags("init"),
  );
  assert.equal(out.code, 2, out.stderr);
  assert.match(out.stderr.trim(), /^config: POIMEN_TENANTS is invalid: /);
});

Deno.test("init: a revoked relay token is replaced by a new one; a limited one put in the file is kept", async () => {
  const db = await freshDatabase(false);
  const dir = await Deno.makeTempDir({ prefix: "poimen-init-" });
  const file = `${dir}/relay_token`;
  const env = { DATABASE_URL: db.url, RELAY_TOKEN_FILE: file, LOG_LEVEL: "info" };
  const init = async () => {
    const out = await runCommand("init", [], env, initPermissions(dir));
    assert.equal(out.code, 0, out.stderr + out.stdout);
    return out.stdout + out.stderr;
  };
  try {
    await init();
    const first = (await Deno.readTextFile(file)).trim();
    const [minted] = await db.sql`select name, tenant_pattern from api_tokens`;
    assert.deepEqual({ ...minted }, { name: "relay", tenant_pattern: null }, "unlimited");

    await db.sql`update api_tokens set revoked_at = now()`;
    assert.match(await init(), /relay token revoked or expired: minted a new one/);
    const second = (await Deno.readTextFile(file)).trim();
    assert.match(second, /^pmn_/);
    assert.notEqual(second, first);
    const live = await db.sql`select name from api_tokens where revoked_at is null`;
    assert.equal(live.length, 1);

    // An operator's limited token in the file is registered already: kept, limit and all.
    const limited = await runCommand(
      "token",
      ["--service", "relay", "--tenants", "acme"],
      { DATABASE_URL: db.url, LOG_LEVEL: "warn" },
      runFlags("token"),
    );
    assert.equal(limited.code, 0, limited.stderr);
    await Deno.writeTextFile(file, limited.stdout);
    assert.match(await init(), /relay token already registered/);
    assert.equal((await Deno.readTextFile(file)).trim(), limited.stdout.trim());
    const [{ n }] = await db.sql`
      select count(*)::int as n from api_tokens where tenant_pattern = 'acme'`;
    assert.equal(n, 1);
  } finally {
    await Deno.remove(dir, { recursive: true });
    await db.drop();
  }
});

Deno.test("init: a relay token file that holds no poimen token is refused in one line, never registered", async () => {
  const db = await freshDatabase(false);
  const dir = await Deno.makeTempDir({ prefix: "poimen-init-" });
  const file = `${dir}/relay_token`;
  try {
    for (
      const junk of ["hunter2", "pmn_short", "relay-token\nsecond line", "pmn_" + "A".repeat(44)]
    ) {
      await Deno.writeTextFile(file, junk + "\n");
      const out = await runCommand(
        "init",
        [],
        { DATABASE_URL: db.url, RELAY_TOKEN_FILE: file, LOG_LEVEL: "warn" },
        initPermissions(dir),
      );
      assert.notEqual(out.code, 0, JSON.stringify(junk));
      const lines = out.stderr.trim().split("\n");
      assert.equal(lines.length, 1, out.stderr);
      assert.match(lines[0], /^init: .*relay_token does not hold a poimen token/);
      assert.ok(!out.stderr.includes(junk.split("\n")[0]), "the file's content is not echoed");
      assert.equal((await Deno.readTextFile(file)).trim(), junk, "the file is left alone");
    }
    const [{ n }] = await db.sql`select count(*)::int as n from api_tokens`;
    assert.equal(n, 0, "nothing registered");
  } finally {
    await Deno.remove(dir, { recursive: true });
    await db.drop();
  }
});

Deno.test("init: --builtins registers echo, sleep and fail (each current) and again changes nothing; without it, and through migrate, the catalog stays empty", async () => {
  const db = await freshDatabase(false);
  const env = { DATABASE_URL: db.url, LOG_LEVEL: "info" };
  const catalog = () =>
    db.sql<{ workflow: string; current: boolean }[]>`
      select v.name || '@' || v.version as workflow, c.version is not null as current
        from workflow_versions v
        left join workflow_current c on c.name = v.name and c.version = v.version
       order by 1`;
  try {
    const plain = await runCommand("init", [], env, runFlags("init"));
    assert.equal(plain.code, 0, plain.stderr);
    assert.deepEqual([...await catalog()], [], "init without --builtins registers no workflow");

    const builtins = await runCommand("init", ["--builtins"], env, runFlags("init"));
    assert.equal(builtins.code, 0, builtins.stderr);
    assert.match(builtins.stderr + builtins.stdout, /built-in workflows registered/);
    const registered = [
      { workflow: "echo@1", current: true },
      { workflow: "fail@1", current: true },
      { workflow: "sleep@1", current: true },
    ];
    assert.deepEqual((await catalog()).map((r) => ({ ...r })), registered);

    const again = await runCommand("init", ["--builtins"], env, runFlags("init"));
    assert.equal(again.code, 0, again.stderr);
    assert.deepEqual((await catalog()).map((r) => ({ ...r })), registered);
  } finally {
    await db.drop();
  }
});
