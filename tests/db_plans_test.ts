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
