/**
 * Every `main.ts` command reads its arguments the same way: `--help` prints
 * usage to stdout and exits 0, flags may stand anywhere, and a usage mistake
 * is one line on stderr with exit code 2. The real commands, run with their
 * deno.json task's permissions.
 */
import assert from "node:assert/strict";
import { freshDatabase } from "./support/db.ts";
import { runCommand, runFlags } from "./support/processes.ts";
import { BROKER, KAFKA_TEST } from "./support/kafka.ts";
import { createAdmin } from "../kafka/admin.ts";
import { tenantTopics } from "../contracts/topics.ts";

const COMMANDS = [
  "api",
  "worker",
  "outbox",
  "relay",
  "migrate",
  "init",
  "token",
  "tenant",
  "workflow",
  "topics",
  "dispatch",
  "dlq",
];

/** Arguments that would be valid for each command, so only the flag under test is wrong. */
const VALID_ARGS: Record<string, string[]> = {
  token: ["acme"],
  tenant: ["acme"],
  topics: ["acme"],
  dispatch: ["acme", "{}"],
  dlq: ["acme"],
};

const run = (command: string, args: string[], env: Record<string, string> = {}) =>
  runCommand(command, args, { LOG_LEVEL: "warn", ...env }, runFlags(command));

function oneLine(stderr: string): string {
  const lines = stderr.trim().split("\n");
  assert.equal(lines.length, 1, `expected one line on stderr, got:\n${stderr}`);
  return lines[0];
}

Deno.test("cli: main.ts --help lists every command on stdout and exits 0", async () => {
  const out = await runCommand("--help", [], {}, []);
  assert.equal(out.code, 0, out.stderr);
  assert.equal(out.stderr, "");
  for (const command of COMMANDS) assert.match(out.stdout, new RegExp(`^  ${command} `, "m"));
});

Deno.test("cli: main.ts with an unknown command says so in one line and exits 2", async () => {
  const out = await runCommand("deploy", [], {}, []);
  assert.equal(out.code, 2);
  assert.match(oneLine(out.stderr), /unknown command "deploy"/);
});

for (const command of COMMANDS) {
  Deno.test(`cli: ${command} --help prints its usage and variables to stdout and exits 0`, async () => {
    // Help wins wherever it stands, even next to arguments that would start the work.
    const out = await run(command, [...VALID_ARGS[command] ?? [], "--help"]);
    assert.equal(out.code, 0, out.stderr);
    assert.equal(out.stderr, "");
    assert.match(out.stdout, new RegExp(`^usage: ${command}\\b`));
    assert.match(out.stdout, /^ {2}-h, --help /m);
    assert.match(out.stdout, /^environment:$/m);
    assert.match(out.stdout, /^ {2}LOG_LEVEL +default info$/m);
  });

  Deno.test(`cli: ${command} with an unknown flag says so in one line on stderr and exits 2`, async () => {
    const out = await run(command, [...VALID_ARGS[command] ?? [], "--no-such-flag"]);
    assert.equal(out.code, 2, out.stdout);
    assert.equal(out.stdout, "");
    assert.equal(
      oneLine(out.stderr),
      `${command}: unknown option '--no-such-flag' (see '${command} --help')`,
    );
  });
}

Deno.test("cli: a command given the wrong number of arguments prints its usage line and exits 2", async () => {
  for (const [command, args] of [["dispatch", ["acme"]], ["migrate", ["extra"]], ["dlq", []]]) {
    const out = await run(command as string, args as string[]);
    assert.equal(out.code, 2, `${command}: ${out.stdout}`);
    assert.match(oneLine(out.stderr), new RegExp(`^usage: ${command}\\b`));
  }
});

Deno.test("cli: token refuses a tenant and --service together, and a flag without its value", async () => {
  const both = await run("token", ["acme", "--service", "relay"]);
  assert.equal(both.code, 2);
  assert.match(oneLine(both.stderr), /either a <tenant> or --service <name>/);
  const bare = await run("token", ["--service"]);
  assert.equal(bare.code, 2);
  assert.match(oneLine(bare.stderr), /^token: option '--service <value>' argument missing/);
});

Deno.test("cli: token's usage mistakes name the bad value in one line, exit 2", async () => {
  const cases: [string[], RegExp][] = [
    [["acme", "--expires-in", "30 days"], /^token: bad --expires-in "30 days": .*30d/],
    [["acme", "--expires-in", "0d"], /^token: bad --expires-in "0d"/],
    [["--service", "relay", "--tenants", "acme|("], /^token: bad --tenants "acme\|\(": /],
    // Regular expressions are not tenant scopes: one escaped its anchors, one backtracked.
    [["--service", "relay", "--tenants", "acme)|(.*"], /^token: bad --tenants "acme\)\|\(\.\*": /],
    [["--service", "relay", "--tenants", "(a+)+"], /^token: bad --tenants "\(a\+\)\+": /],
    [["--service", "relay", "--tenants", "acme|beta"], /^token: bad --tenants .*acme,beta,team-\*/],
    [["acme", "--tenants", "acme"], /^token: --tenants limits a service token/],
    [["--service", "relay", "--name", "x"], /^token: --name is for tenant tokens/],
    // A subcommand word in another position is not taken for a tenant.
    [["--name", "ci", "list"], /^token: "list" is a subcommand .*'token create list'/],
    [["list"], /^token list: give either a <tenant> or --service/],
    [["list", "acme", "--service"], /^token list: give either a <tenant> or --service/],
    [["revoke", "not-an-id"], /^token revoke: bad token id "not-an-id"/],
    [["revoke"], /^usage: token revoke <id>/],
  ];
  for (const [args, message] of cases) {
    const out = await run("token", args);
    assert.equal(out.code, 2, `${args.join(" ")}: ${out.stdout}`);
    assert.equal(out.stdout, "");
    assert.match(oneLine(out.stderr), message);
  }
  for (const sub of ["list", "revoke"]) {
    const help = await run("token", [sub, "--help"]);
    assert.equal(help.code, 0, help.stderr);
    assert.match(help.stdout, new RegExp(`^usage: token ${sub} `));
  }
});

Deno.test("cli: workflow's usage mistakes name the bad value in one line, exit 2, before touching the database", async () => {
  // An unreachable database: a usage mistake is found before connecting.
  const env = { DATABASE_URL: "postgres://postgres@127.0.0.1:1/nowhere" };
  const cases: [string[], RegExp][] = [
    [[], /^workflow: give list or promote/],
    [["promot", "billing.invoice@2"], /^workflow: unknown subcommand "promot": list or promote/],
    [
      ["promote", "billing.invoice"],
      /^workflow promote: bad version "billing.invoice": give <name>@<version>, e.g. billing.invoice@2$/,
    ],
    [["promote", "Billing@2"], /^workflow promote: bad version "Billing@2"/],
    [["promote", "billing.invoice@0"], /^workflow promote: bad version "billing.invoice@0"/],
    [["promote"], /^usage: workflow promote <name>@<version>/],
    [["promote", "a@1", "b@2"], /^usage: workflow promote <name>@<version>/],
    [["list", "billing.invoice@2"], /^workflow list: bad workflow name "billing.invoice@2"/],
    [["list", "--current"], /^workflow list: unknown option '--current'/],
  ];
  for (const [args, message] of cases) {
    const out = await run("workflow", args, env);
    assert.equal(out.code, 2, `${args.join(" ")}: ${out.stdout}${out.stderr}`);
    assert.equal(out.stdout, "");
    assert.match(oneLine(out.stderr), message);
  }
  for (const sub of ["list", "promote"]) {
    const help = await run("workflow", [sub, "--help"]);
    assert.equal(help.code, 0, help.stderr);
    assert.match(help.stdout, new RegExp(`^usage: workflow ${sub} `));
  }
});

Deno.test("cli: a bad tenant id is a usage mistake: one line, exit 2", async () => {
  for (const command of ["token", "tenant", "topics", "dispatch", "dlq"]) {
    const args = command === "dispatch" ? ["Not A Tenant", "{}"] : ["Not A Tenant"];
    const out = await run(command, args);
    assert.equal(out.code, 2, `${command}: ${out.stdout}`);
    assert.match(oneLine(out.stderr), new RegExp(`^${command}: bad tenant id "Not A Tenant"`));
  }
});

Deno.test("cli: tenant's usage mistakes name the bad value in one line, exit 2", async () => {
  const cases: [string[], RegExp][] = [
    [["acme", "--max-queued=-1"], /^tenant: bad --max-queued "-1": a whole number from 0/],
    [["acme", "--max-queued", "ten"], /^tenant: bad --max-queued "ten"/],
    [["acme", "--max-queued", "1.5"], /^tenant: bad --max-queued "1.5"/],
    [["acme", "--max-queued", "99999999999"], /^tenant: bad --max-queued "99999999999"/],
    [["acme", "--rate", "0"], /^tenant: bad --rate "0": runs per second above 0/],
    [["acme", "--rate=-2"], /^tenant: bad --rate "-2"/],
    [["acme", "--rate", "fast"], /^tenant: bad --rate "fast"/],
    [["acme", "--max-queued"], /^tenant: option '--max-queued <value>' argument missing/],
    [["acme", "--burst", "3"], /^tenant: unknown option '--burst'/],
    [[], /^usage: tenant <tenant>/],
  ];
  for (const [args, message] of cases) {
    const out = await run("tenant", args);
    assert.equal(out.code, 2, `${args.join(" ")}: ${out.stdout}`);
    assert.equal(out.stdout, "");
    assert.match(oneLine(out.stderr), message);
  }
});

Deno.test("cli: tenant prints and sets a tenant's quotas, one line each; an unknown tenant is exit 1", async () => {
  const db = await freshDatabase();
  try {
    const env = { DATABASE_URL: db.url };
    const unknown = await run("tenant", ["acme"], env);
    assert.equal(unknown.code, 1);
    assert.equal(oneLine(unknown.stderr), 'tenant: no tenant "acme"');
    const set = await run("tenant", ["acme", "--max-queued", "100", "--rate", "2.5"], env);
    assert.equal(set.code, 0, set.stderr);
    assert.equal(set.stderr, "");
    assert.equal(
      set.stdout,
      "acme: max-queued 100, rate 2.5/s (set; the APIs apply it within QUOTA_REFRESH_MS)\n",
    );
    const rate = await run("tenant", ["--rate", "none", "acme"], env);
    assert.match(rate.stdout, /^acme: max-queued 100, rate unlimited \(set;/);
    const shown = await run("tenant", ["acme"], env);
    assert.equal(shown.stdout, "acme: max-queued 100, rate unlimited\n");
    const [row] = await db
      .sql`select max_queued, admission_rate from tenants where tenant_id = 'acme'`;
    assert.deepEqual({ ...row }, { max_queued: 100, admission_rate: null });
  } finally {
    await db.drop();
  }
});

Deno.test("cli: token prints one token for a tenant, and for --service=<name>", async () => {
  const db = await freshDatabase();
  try {
    const env = { DATABASE_URL: db.url };
    const tenant = await run("token", ["acme"], env);
    assert.equal(tenant.code, 0, tenant.stderr);
    const service = await run("token", ["--service=relay"], env);
    assert.equal(service.code, 0, service.stderr);
    for (const out of [tenant, service]) assert.match(out.stdout, /^pmn_\S+\n$/);
  } finally {
    await db.drop();
  }
});

Deno.test({
  name:
    "cli: dispatch takes --raw after its arguments, and -- ends the flags; --signal sends a signal message",
  ...KAFKA_TEST,
  fn: async () => {
    const tenant = `cli-${crypto.randomUUID().slice(0, 8)}`;
    const env = { KAFKA_BROKERS: BROKER, TOPIC_PARTITIONS: "1" };
    try {
      const declared = await run("topics", ["--", tenant], env);
      assert.equal(declared.code, 0, declared.stderr);
      assert.match(declared.stdout, new RegExp(`^created poimen\\.${tenant}\\.dispatch$`, "m"));

      // Not JSON: only --raw lets it through, wherever the flag stands.
      const refused = await run("dispatch", [tenant, "not json"], env);
      assert.equal(refused.code, 65, refused.stdout);
      const sent = await run("dispatch", [tenant, "not json", "--raw"], env);
      assert.equal(sent.code, 0, sent.stderr);
      assert.match(sent.stdout, new RegExp(`^poimen\\.${tenant}\\.dispatch 0 0\\n$`));

      // Checked against the schema by the publisher (client/dispatch.ts).
      const invalid = await run("dispatch", [tenant, '{"workflow_ref":"Not A Ref"}'], env);
      assert.equal(invalid.code, 65, invalid.stdout);
      assert.match(invalid.stderr, /^dispatch: workflow_ref: /m);
      // A body without a key gets one, said on stderr.
      const keyless = await run("dispatch", [tenant, '{"workflow_ref":"echo"}'], env);
      assert.equal(keyless.code, 0, keyless.stderr);
      assert.match(keyless.stdout, new RegExp(`^poimen\\.${tenant}\\.dispatch 0 1\\n$`));
      assert.match(keyless.stderr, /dispatch_key [0-9a-f-]{36} \(generated\)/);

      // --signal: a signal message to the signals topic, its relay-derived id on stderr.
      const runId = crypto.randomUUID();
      const signal = await run("dispatch", [
        "--signal",
        tenant,
        JSON.stringify({ run_id: runId, name: "approval", payload: { ok: true } }),
      ], env);
      assert.equal(signal.code, 0, signal.stderr);
      assert.match(signal.stdout, new RegExp(`^poimen\\.${tenant}\\.signals 0 0\\n$`));
      assert.match(signal.stderr, new RegExp(`signal_id kafka:poimen\\.${tenant}\\.signals/0/0`));
      const badSignal = await run("dispatch", ["--signal", tenant, '{"name":"approval"}'], env);
      assert.equal(badSignal.code, 65, badSignal.stdout);
      assert.match(badSignal.stderr, /^dispatch: run_id: /m);
      const both = await run("dispatch", ["--signal", "--raw", tenant, "{}"], env);
      assert.equal(both.code, 2, both.stdout);
    } finally {
      const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
      try {
        await admin.deleteTopics(tenantTopics(tenant));
      } finally {
        await admin.close();
      }
    }
  },
});
