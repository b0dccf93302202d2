/**
 * The hot statements keep their intended index whatever the statistics say.
 *
 * Our Postgres runs with autovacuum off, so a table is never analyzed unless
 * someone asks: the planner then guesses every selectivity (0.5 % for an
 * equality) and, at some table sizes, two indexes cost the same to within its
 * fuzz factor. A prepared statement that got its generic plan at such a size
 * keeps it while the table grows: this is how admission fell from ~2,200/s to
 * ~80/s at 60,000 runs (its replay probe kept `runs_status_idx` and filtered
 * every run of the tenant).
 *
 * Each statement is captured as the code issues it (the pool's debug hook
 * records the text and parameters of a real call, rolled back), then
 * prepared and explained with a generic and with a custom plan, on an empty
 * table, at 1,000 runs, at 50,000 runs never analyzed, and after ANALYZE.
 *
 * The claims are sent unprepared (db/claims.ts): their plans are checked as
 * custom plans, and a second test runs them call after call as a worker does
 * and reads the plans the server actually executed (auto_explain), with
 * their loops and buffers: never a prepared statement (whose generic plan a
 * claim would get after five calls), never JIT-compiled (db/pool.ts).
 */
import assert from "node:assert/strict";
import {
  addRuns,
  capturingPool,
  countSlots,
  explain,
  hotStatements,
  type PlanNode,
  type Sample,
  sample,
  scans,
  TENANTS,
} from "./support/plans.ts";
import { freshDatabase, type TestDatabase } from "./support/db.ts";
import postgres from "postgres";
import { insertRuns, type NewRun } from "../db/admission.ts";
import { claimLimitedRuns, claimRuns } from "../db/claims.ts";
import { createPool, type Sql } from "../db/pool.ts";

const MODIFY = new Set(["ModifyTable"]);

/** Which index each scan of each relation uses ("Seq Scan" when none); bitmap scans by their index. */
function indexUse(plan: PlanNode): Map<string, Set<string>> {
  const use = new Map<string, Set<string>>();
  const add = (rel: string, how: string) => {
    if (!use.has(rel)) use.set(rel, new Set());
    use.get(rel)!.add(how);
  };
  // A Bitmap Index Scan names its index, its Bitmap Heap Scan parent the table.
  const bitmapTable = new Map<PlanNode, string>();
  const walk = (node: PlanNode) => {
    if (node["Node Type"] === "Bitmap Heap Scan") {
      const mark = (n: PlanNode) => {
        if (n["Node Type"] === "Bitmap Index Scan") bitmapTable.set(n, node["Relation Name"]!);
        for (const c of n.Plans ?? []) mark(c);
      };
      for (const c of node.Plans ?? []) mark(c);
    }
    for (const c of node.Plans ?? []) walk(c);
  };
  walk(plan);
  for (const node of scans(plan)) {
    const type = node["Node Type"];
    if (MODIFY.has(type) || type === "Bitmap Heap Scan") continue;
    if (type === "Bitmap Index Scan") add(bitmapTable.get(node)!, node["Index Name"]!);
    else if (node["Index Name"]) add(node["Relation Name"]!, node["Index Name"]);
    else add(node["Relation Name"]!, type);
  }
  return use;
}

/** Checks every hot statement in both plan modes; returns the failures, one line each. */
async function checkPlans(
  db: TestDatabase,
  stage: string,
  sample: Sample,
  runs: number,
): Promise<string[]> {
  const spy = capturingPool(db.url);
  const failures: string[] = [];
  try {
    for (const hot of hotStatements(sample)) {
      if (runs < (hot.fromRuns ?? 0)) continue;
      const statements = await spy.capture(hot.call);
      assert.ok(statements.length > 0, `${hot.name} issued no statement`);
      for (const mode of hot.modes ?? ["force_generic_plan", "force_custom_plan"] as const) {
        // A call of several statements (a transaction) uses each wanted
        // index in one of them; no statement may use another.
        const uses: Map<string, Set<string>>[] = [];
        for (const stmt of statements) uses.push(indexUse(await explain(db.sql, stmt, mode)));
        for (const [rel, wanted] of Object.entries(hot.indexes)) {
          const got = new Set(uses.flatMap((use) => [...use.get(rel) ?? []]));
          const wrong = [...got].filter((i) => !wanted.includes(i));
          const missing = wanted.filter((i) => !got.has(i));
          if (wrong.length || missing.length) {
            failures.push(
              `${stage}, ${mode.replace(/^force_|_plan$/g, "")}: ${hot.name} reads ${rel} via ` +
                `[${[...got].join(", ")}], wants [${wanted.join(", ")}]`,
            );
          }
        }
        for (const use of uses) {
          // concurrency_slots is checked where a statement names it; runs and
          // work_events always: a statement not naming one must not read it.
          for (const rel of ["runs", "work_events"]) {
            if (!(rel in hot.indexes) && use.has(rel)) {
              failures.push(
                `${stage}, ${mode}: ${hot.name} reads ${rel} unexpectedly via ` +
                  `[${[...use.get(rel)!].join(", ")}]`,
              );
            }
          }
        }
      }
    }
  } finally {
    await spy.sql.end();
  }
  return failures;
}

Deno.test("plans: admission, claim and outbox statements use their intended index at any size, with or without statistics", async () => {
  const db = await freshDatabase();
  try {
    await db.sql`insert into tenants
                 select 't' || lpad(g::text, 2, '0') from generate_series(0, ${TENANTS - 1}) g`;
    const failures: string[] = [];
    let rows = 0;
    // Small sizes matter: there, on a table never analyzed, a tenant's index
    // and the unique index cost the same to within the planner's fuzz, and a
    // prepared statement keeps the generic plan it got there.
    for (const size of [0, 100, 300, 500, 700, 1_000, 5_000, 50_000]) {
      if (size > rows) await addRuns(db.sql, rows + 1, size);
      await countSlots(db.sql);
      rows = size;
      const stage = `${size.toLocaleString("en")} runs, never analyzed`;
      failures.push(...await checkPlans(db, stage, await sample(db.sql), size));
    }
    const [stats] = await db.sql<{ reltuples: number; analyzed: number }[]>`
      select c.reltuples::float8 as reltuples,
             (select count(*) from pg_stats s where s.tablename = 'runs')::int as analyzed
        from pg_class c where c.relname = 'runs'`;
    assert.deepEqual(stats, { reltuples: -1, analyzed: 0 }, "runs must never have been analyzed");
    await db.sql`analyze runs`;
    await db.sql`analyze work_events`;
    await db.sql`analyze concurrency_slots`;
    failures.push(
      ...await checkPlans(db, "50,000 runs, analyzed", await sample(db.sql), rows),
    );
    assert.deepEqual(failures, []);
  } finally {
    await db.drop();
  }
});

/** One execution of a statement as the server ran it (auto_explain, analyzed, with buffers). */
interface ServerPlan {
  "Query Text": string;
  Plan: PlanNode & Record<string, number>;
  JIT?: unknown;
}

/**
 * A one-connection pool with the settings `createPool` gives its sessions
 * (JIT off among them), whose server explains every statement it executes,
 * analyzed with its buffers, to the client as a notice (auto_explain at
 * level notice): the plans the server actually ran, whatever it prepared.
 */
async function explainingPool(url: string, plans: ServerPlan[]): Promise<Sql> {
  const base = createPool({ url, max: 1, applicationName: "plan-test" });
  const o = base.options;
  await base.end();
  return postgres({
    ...o,
    shared: { retries: 0, typeArrayMap: {} },
    parameters: {},
    max: 1,
    connection: {
      ...o.connection,
      session_preload_libraries: "auto_explain",
      "auto_explain.log_min_duration": "0",
      "auto_explain.log_analyze": "on",
      "auto_explain.log_buffers": "on",
      "auto_explain.log_timing": "off",
      "auto_explain.log_format": "json",
      "auto_explain.log_level": "notice",
    },
    onnotice: (n: { message: string }) => {
      const at = n.message.indexOf("{");
      if (at >= 0) plans.push(JSON.parse(n.message.slice(at)));
    },
  } as unknown as postgres.Options<Record<string, postgres.PostgresType>>);
}

/** Index probes of `runs` in a plan: the loops of its index scans. */
function runsProbes(plan: PlanNode): number {
  let loops = 0;
  const walk = (node: PlanNode) => {
    const n = node as PlanNode & Record<string, number>;
    if (node["Relation Name"] === "runs" && String(node["Node Type"]).includes("Index")) {
      loops += n["Actual Loops"] ?? 1;
    }
    for (const c of node.Plans ?? []) walk(c);
  };
  walk(plan);
  return loops;
}

// A worker with 128 free slots claims this many at once: there a claim's
// custom plan is estimated past jit_above_cost, and with no statistics its
// generic plan is estimated cheaper than its custom ones, so a prepared
// claim switches to it after five calls.
const BATCH = 128;
const CLAIM_TENANTS = 300;

/** Each tenant: 8 due echo runs at priority 5 and 8 at 0, and 4 due runs of keys of its own. */
async function claimLoad(sql: Sql): Promise<void> {
  await sql`insert into tenants select 'c' || g from generate_series(1, ${CLAIM_TENANTS}::int) g`;
  for (let t = 1; t <= CLAIM_TENANTS; t += 25) {
    const batch: NewRun[] = [];
    for (let u = t; u < t + 25; u++) {
      for (let i = 0; i < 20; i++) {
        const keyed = i >= 16;
        batch.push({
          tenant_id: `c${u}`,
          run_id: crypto.randomUUID(),
          workflow_ref: keyed ? "keyed" : "echo",
          workflow_name: keyed ? "keyed" : "echo",
          workflow_version: 1,
          input: {},
          goal_id: null,
          dispatch_key: null,
          source: "plan-test",
          max_attempts: 3,
          run_after: null,
          priority: i < 8 ? 5 : 0,
          concurrency_key: keyed ? `k${i}` : null,
          concurrency_limit: keyed ? 1 : null,
        });
      }
    }
    await insertRuns(sql, batch);
  }
}

/**
 * Runs `call` `times` times on one session as the worker does (each in a
 * transaction rolled back, so each sees the same queue), and returns how
 * many runs each claimed, the plan the server ran each time, and the
 * claim statements the session holds prepared afterwards.
 */
async function serverClaims(url: string, call: (sql: Sql) => Promise<unknown[]>, times: number) {
  const plans: ServerPlan[] = [];
  const sql = await explainingPool(url, plans);
  const claimed: number[] = [];
  const rollback = new Error("rollback");
  try {
    for (let i = 0; i < times; i++) {
      await sql.begin(async (tx) => {
        claimed.push((await call(tx as unknown as Sql)).length);
        throw rollback;
      }).catch((err) => {
        if (err !== rollback) throw err;
      });
    }
    // Its text split, so that this statement (prepared by the driver) is not one it finds.
    const prepared = await sql<{ generic_plans: number; custom_plans: number }[]>`
      select generic_plans::int, custom_plans::int from pg_prepared_statements
       where statement like '%with recursive' || ' versions%'`;
    const ran = plans.filter((p) => p["Query Text"].includes("with recursive versions"));
    return { claimed, ran, prepared };
  } finally {
    await sql.end();
  }
}

Deno.test("plans: the claims the server runs, call after call, are planned for their values, never JIT-compiled, and read O(claimed), with no statistics and analyzed", async () => {
  const db = await freshDatabase();
  try {
    await claimLoad(db.sql);
    const claims: [string, (sql: Sql) => Promise<unknown[]>][] = [
      [
        "claimRuns",
        (sql) => claimRuns(sql, "w", BATCH, 30_000, { names: ["echo"], versions: [1] }),
      ],
      [
        "claimLimitedRuns",
        (sql) => claimLimitedRuns(sql, "w", BATCH, 30_000, { names: ["keyed"], versions: [1] }),
      ],
    ];
    const failures: string[] = [];
    for (const stage of ["never analyzed", "analyzed"]) {
      if (stage === "analyzed") {
        for (const t of ["runs", "queue_lanes", "concurrency_slots"]) {
          await db.sql.unsafe(`analyze ${t}`);
        }
      } else {
        const [{ analyzed }] = await db.sql<{ analyzed: number }[]>`
          select count(*)::int as analyzed from pg_stats
           where tablename in ('runs', 'queue_lanes', 'concurrency_slots')`;
        assert.equal(analyzed, 0, "no statistics yet");
      }
      for (const [name, call] of claims) {
        const { claimed, ran, prepared } = await serverClaims(db.url, call, 8);
        const at = `${stage}, ${name}`;
        assert.deepEqual(claimed, Array(8).fill(BATCH), `${at}: every call claims a full batch`);
        assert.equal(ran.length, 8, `${at}: the server explained every call`);
        // A prepared claim would be here, with its generic plans counted.
        if (prepared.length) failures.push(`${at}: prepared ${JSON.stringify(prepared)}`);
        for (const [i, { Plan: plan, JIT: jit }] of ran.entries()) {
          if (jit) failures.push(`${at}, call ${i + 1}: JIT-compiled ${JSON.stringify(jit)}`);
          // Per lane or group of two priorities (one run claimed of each):
          // three probes find its priorities, two take its share, two find
          // its next run, and a few more; one per priority a run may have
          // (21) would be over 42.
          const probes = runsProbes(plan);
          if (probes > 10 * BATCH) failures.push(`${at}, call ${i + 1}: ${probes} probes of runs`);
          const buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"];
          if (buffers > 40 * BATCH) failures.push(`${at}, call ${i + 1}: ${buffers} buffers`);
        }
      }
    }
    assert.deepEqual(failures, []);
  } finally {
    await db.drop();
  }
});
