/**
 * The body budget against a real API process, attacked over raw TCP as a
 * hostile tenant would: uploads that declare a 1 MiB body and send one byte
 * hold their own tenant's share of BODY_BUDGET_BYTES, not the whole of it,
 * so another tenant's small POST is admitted while they are still open, and
 * the relay's (a service token's) is admitted while tenants fill theirs.
 * Default settings: a 4 MiB budget, 1 MiB per tenant, 1 MiB for services.
 */
import assert from "node:assert/strict";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, newToken } from "./support/processes.ts";

const MiB = 1024 * 1024;

/** An upload that declares a 1 MiB body, sends its first byte and then nothing. */
interface IdleUpload {
  conn: Deno.TcpConn;
  /** Whether the API has answered or closed the connection. */
  answered: boolean;
}

async function idleUpload(api: ApiProcess, token: string): Promise<IdleUpload> {
  const { hostname, port } = new URL(api.url);
  const conn = await Deno.connect({ hostname, port: Number(port) });
  const head = [
    "POST /v1/runs HTTP/1.1",
    `Host: ${hostname}:${port}`,
    `Authorization: Bearer ${token}`,
    "Content-Type: application/json",
    `Content-Length: ${MiB}`,
    "",
    "",
  ].join("\r\n");
  await conn.write(new TextEncoder().encode(head + "{"));
  const upload: IdleUpload = { conn, answered: false };
  // Any byte back, or the end of the stream, is an answer.
  conn.read(new Uint8Array(1024)).then(
    () => upload.answered = true,
    () => upload.answered = true,
  );
  return upload;
}

/** Waits until the API holds or queues `n` uploads of 1 MiB in its body budget. */
async function budgetTaken(api: ApiProcess, n: number): Promise<void> {
  await waitFor(`${n} uploads in the body budget`, async () => {
    const held = await api.metric("poimen_request_body_budget_bytes_held");
    const waiting = await api.metric("poimen_request_body_budget_waiting");
    return held / MiB + waiting === n;
  }, 10_000);
}

function post(api: ApiProcess, token: string, headers: Record<string, string> = {}) {
  return fetch(`${api.url}/v1/runs`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json", ...headers },
    body: JSON.stringify({ workflow_ref: "echo", input: { n: 1 } }),
  });
}

Deno.test("it: four idle 1 MiB uploads of one tenant do not hold back another tenant's 40-byte POST", async () => {
  const db = await freshDatabase();
  let api: ApiProcess | undefined;
  const uploads: IdleUpload[] = [];
  try {
    const a = await newToken(db.url, "budget-a");
    const b = await newToken(db.url, "budget-b");
    api = await new ApiProcess({ DATABASE_URL: db.url }).ready();
    for (let i = 0; i < 4; i++) uploads.push(await idleUpload(api, a));
    await budgetTaken(api, 4);

    const res = await post(api, b);
    assert.equal(res.status, 201, await res.text());
    assert.deepEqual(
      uploads.map((u) => u.answered),
      [false, false, false, false],
      "tenant a's uploads are still open",
    );
  } finally {
    for (const u of uploads) u.conn.close();
    await api?.stop();
    await db.drop();
  }
});

Deno.test("it: the relay's service token is admitted while tenants' idle uploads fill their part of the body budget", async () => {
  const db = await freshDatabase();
  let api: ApiProcess | undefined;
  const uploads: IdleUpload[] = [];
  try {
    const tenants = ["budget-a", "budget-b", "budget-c", "budget-d"];
    const tokens = [];
    for (const t of tenants) tokens.push(await newToken(db.url, t));
    const relay = await newToken(db.url, "--service", "relay");
    api = await new ApiProcess({ DATABASE_URL: db.url }).ready();
    for (const token of tokens) uploads.push(await idleUpload(api, token));
    await budgetTaken(api, 4);

    const res = await post(api, relay, { "Poimen-Tenant": "budget-a" });
    const text = await res.text();
    assert.equal(res.status, 201, text);
    assert.equal(JSON.parse(text).tenant_id, "budget-a");
    assert.deepEqual(uploads.map((u) => u.answered), [false, false, false, false]);
  } finally {
    for (const u of uploads) u.conn.close();
    await api?.stop();
    await db.drop();
  }
});
