/**
 * The baseline the admission benchmark compares against: a minimal hono +
 * postgres.js endpoint doing one `INSERT … ON CONFLICT DO NOTHING` per
 * request, with no auth, validation, outbox event or metrics.
 */
import { Hono } from "hono";
import postgres from "postgres";

const sql = postgres(Deno.env.get("DATABASE_URL")!, { max: 10, onnotice: () => {} });
await sql`create table if not exists bench_minimal (
  tenant_id text not null, run_id uuid not null, dispatch_key text, input jsonb,
  primary key (tenant_id, run_id))`;
await sql`create unique index if not exists bench_minimal_key on bench_minimal (tenant_id, dispatch_key)
  where dispatch_key is not null`;

const app = new Hono();
app.post("/v1/runs", async (c) => {
  const body = await c.req.json();
  const [row] = await sql`
    insert into bench_minimal (tenant_id, run_id, dispatch_key, input)
    values ('bench', ${crypto.randomUUID()}, ${body.dispatch_key ?? null}, ${sql.json(body.input)})
    on conflict (tenant_id, dispatch_key) where dispatch_key is not null do nothing
    returning run_id`;
  return c.json({ run_id: row?.run_id ?? null }, row ? 201 : 200);
});
const port = Number(Deno.env.get("PORT"));
Deno.serve({ port, hostname: "127.0.0.1", onListen: () => {} }, app.fetch);
