/**
 * The road to partitioning `runs` and `work_events` by tenant (hash
 * partitions, later Citus) stays open: every statement the code issues on
 * them names its tenant — each scan of either table carries an equality on
 * `tenant_id` (with a parameter, or with a tenant found by the step before
 * it), so it touches one partition. The statements that do not are listed
 * here, each with why, and the test fails when the list changes either way.
 *
 * Two checks: every exported function in db/ whose SQL reaches `runs` or
 * `work_events` (read from the source: its own text, or a constant or helper
 * it uses) is among the statements explained, so a new statement cannot
 * escape; and each one's plans, generic and custom, on a table of a few
 * thousand runs never analyzed, are walked scan by scan.
 */
import assert from "node:assert/strict";
import type { Sql } from "../db/pool.ts";
import { selectEventSeqs, selectRuns } from "../db/runs.ts";
import { queueStats } from "../db/queue_stats.ts";
import { cancelTree } from "../db/cascade.ts";
import {
  addRuns,
  capturingPool,
  countSlots,
  explain,
  type HotStatement,
  hotStatements,
  type PlanNode,
  type Sample,
  sample,
  scans,
  TENANTS,
} from "./support/plans.ts";
import { freshDatabase } from "./support/db.ts";

/**
 * The statements that scan `runs` or `work_events` without naming a tenant,
 * the scans that do not, and why. Two find which tenants have due work —
 * expired leases for the reclaimer, unpublished events for the outbox —
 * each a loose or ordered scan of a partial index (a partitioned table
 * answers it with one scan per partition); every other read of those
 * statements is a tenant's range. The rest are metrics and retention, off
 * every run's path.
 *
 * The claims find who has due work across tenants too, by design, but not
 * in `runs`: in the small summary tables kept beside it (migration 016), one
 * range of `queue_lanes_ready_idx` per hosted version and of
 * `concurrency_slots_due_idx` per hosted workflow, in due order. Those
 * tables stay whole when `runs` is partitioned by tenant (a row per tenant
 * and version, or per group), so every read of `runs` a claim makes names
 * the tenant of the lane or group it serves, as checked here.
 */
const NOT_TENANT_SCOPED: Record<string, { why: string; via: string[] }> = {
  "queue: reclaimExpired": {
    why: "finds the tenants with running runs, whose expired leases are due work: the loose " +
      "scan's probes",
    via: ["runs via runs_running_tenant_idx"],
  },
  "durable: wakeDueRuns": {
    why: "the leader's waker finds the tenants with waiting runs (a loose scan, one probe per " +
      "tenant); each one's runs past their deadline are then its tenant's range",
    via: ["runs via runs_waiting_tenant_idx"],
  },
  "maintenance: repairLanes": {
    why: "the leader's walk of the lanes of queued runs, across tenants by design (a loose " +
      "scan, one probe per lane); each lane's earliest run is then its tenant's range",
    via: ["runs via runs_queued_workflow_idx"],
  },
  "queue: queueCounts": {
    why: "metrics: the tenants with queued and with waiting runs (loose scans), and the " +
      "fleet's running runs (up to a cap)",
    via: [
      "runs via Bitmap Heap Scan",
      "runs via runs_queued_workflow_idx",
      "runs via runs_running_tenant_idx",
      "runs via runs_waiting_tenant_idx",
    ],
  },
  "queue: selectUnhostedQueues": {
    why: "metrics: the tenants with queued runs (the loose scan)",
    via: ["runs via runs_queued_workflow_idx"],
  },
  "queue: queueStats": {
    why: "metrics: queueCounts and selectUnhostedQueues, as above",
    via: [
      "runs via Bitmap Heap Scan",
      "runs via runs_queued_workflow_idx",
      "runs via runs_running_tenant_idx",
      "runs via runs_waiting_tenant_idx",
    ],
  },
  "outbox: claimPendingEvents": {
    why: "finds every tenant's unpublished events, oldest first: the outbox's due work",
    via: ["work_events via work_events_pending_idx"],
  },
  "outbox: outboxStats": {
    why: "metrics: the outbox's pending and parked events across tenants",
    via: ["work_events via Bitmap Heap Scan", "work_events via work_events_pending_idx"],
  },
  "outbox: purgePublished": {
    why: "retention: published events past their age, across tenants",
    via: ["work_events via Bitmap Heap Scan", "work_events via work_events_published_idx"],
  },
  "retention: purgeFinishedRuns": {
    why: "retention: finished runs past their age, across tenants, deleted by ctid",
    via: ["runs via Bitmap Heap Scan", "runs via Tid Scan", "work_events via Tid Scan"],
  },
};

/** Statements not in the plan test's hot list, explained here too. */
function otherStatements(s: Sample): HotStatement[] {
  return [
    {
      name: "api: selectRuns",
      call: (sql) => selectRuns(sql, s.tenant, { status: "queued", goalId: "goal-1", limit: 50 }),
      indexes: {},
    },
    {
      name: "api: selectRuns, by dispatch key",
      call: (sql) => selectRuns(sql, s.tenant, { dispatchKey: "key-3", limit: 50 }),
      indexes: {},
    },
    {
      // queueCounts and selectUnhostedQueues, as one scrape reads them.
      name: "queue: queueStats",
      call: (sql) => queueStats(sql),
      indexes: {},
    },
    {
      // requestCancel, then cancelRuns per level: each in the plan test.
      name: "cascade: cancelTree",
      call: (sql) => cancelTree(sql, s.tenant, s.runningRun),
      indexes: {},
    },
    {
      name: "api: selectEventSeqs",
      call: (sql) => selectEventSeqs(sql, [{ tenant_id: s.tenant, run_id: s.runningRun }]),
      indexes: {},
    },
  ];
}

// A tenant equality: `(tenant_id)::text = $1`, `((tenant_id)::text COLLATE
// "C") = t.tenant_id`, `tenant_id = k.tenant_id` (not `>`, `>=`, `<>`).
const TENANT_EQUALITY = /\btenant_id\b[^=<>!]{0,40}=\s/;

/** The scans of runs or work_events in `plan` with no tenant equality, as `table via how`. */
function unscoped(plan: PlanNode): string[] {
  const out: string[] = [];
  for (const node of scans(plan)) {
    const n = node as unknown as PlanNode & Record<string, unknown>;
    if (n["Node Type"] === "ModifyTable" || n["Node Type"] === "Bitmap Index Scan") continue;
    const table = n["Relation Name"];
    if (table !== "runs" && table !== "work_events") continue;
    // A bitmap heap scan's condition is on its index scans below it.
    const conds = [n["Index Cond"], n["Recheck Cond"], n["Filter"], n["TID Cond"]]
      .concat((n.Plans ?? []).map((c) => (c as unknown as Record<string, unknown>)["Index Cond"]))
      .filter((c): c is string => typeof c === "string");
    if (!conds.some((c) => TENANT_EQUALITY.test(c))) {
      out.push(`${table} via ${n["Index Name"] ?? n["Node Type"]}`);
    }
  }
  return out;
}

/**
 * The exported functions of db/ whose SQL reaches runs or work_events: a
 * top-level declaration touches them when its text has `from|into|update|
 * join runs|work_events`, or names a declaration (of any db/ module) that
 * does, to a fixed point. Only those taking a pool (`sql: Sql`) issue
 * statements: a SQL fragment's builder (db/child_events.ts'
 * `childFinishedMoves`) is checked in the statements that embed it.
 */
async function functionsOnRunTables(): Promise<string[]> {
  const decls: { name: string; exported: boolean; text: string }[] = [];
  for await (const e of Deno.readDir(new URL("../db/", import.meta.url))) {
    if (!e.name.endsWith(".ts")) continue;
    const text = await Deno.readTextFile(new URL(`../db/${e.name}`, import.meta.url));
    const starts = [...text.matchAll(
      /^(export )?(?:async )?(?:function|const|class) (\w+)/gm,
    )];
    starts.forEach((m, i) => {
      const end = i + 1 < starts.length ? starts[i + 1].index : text.length;
      // Comments out: a doc comment belongs to the declaration after it.
      const code = text.slice(m.index, end).replace(/\/\*[\s\S]*?\*\//g, "")
        .replace(/^\s*\/\/.*$/gm, "");
      decls.push({ name: m[2], exported: m[1] !== undefined, text: code });
    });
  }
  const touching = new Set(
    decls.filter((d) => /\b(from|into|update|join)\s+(runs|work_events)\b/.test(d.text))
      .map((d) => d.name),
  );
  for (let grew = true; grew;) {
    grew = false;
    for (const d of decls) {
      if (touching.has(d.name)) continue;
      const uses = [...touching].some((t) => new RegExp(`\\b${t}\\b`).test(d.text));
      if (uses) {
        touching.add(d.name);
        grew = true;
      }
    }
  }
  return decls.filter((d) =>
    d.exported && touching.has(d.name) && /function/.test(d.text) && /\bsql: Sql\b/.test(d.text)
  )
    .map((d) => d.name).sort();
}

Deno.test("tenant scope: every db/ function that reaches runs or work_events is among the statements explained", async () => {
  const explained = new Set<string>();
  const dummy: Sample = {
    tenant: "t00",
    runningRun: crypto.randomUUID(),
    owner: "w",
    attempt: 1,
    pendingEventId: "1",
  };
  for (const st of [...hotStatements(dummy), ...otherStatements(dummy)]) {
    // The function a statement calls, by its source text: `(sql) => name(…)`.
    for (const m of st.call.toString().matchAll(/\b(\w+)\(sql/g)) explained.add(m[1]);
  }
  // A fragment every statement that makes runs final appends (db/fan_in.ts):
  // explained with each of them.
  explained.add("fanIn");
  const reaching = await functionsOnRunTables();
  assert.ok(reaching.includes("claimRuns") && reaching.includes("insertRuns"), reaching.join());
  // completeRun calls completeRuns; the plan test explains both.
  const missing = reaching.filter((f) => !explained.has(f));
  assert.deepEqual(missing, [], "explain these in tests/support/plans.ts or here");
});

Deno.test("tenant scope: apart from the listed cross-tenant steps, every statement on runs and work_events names its tenant", async () => {
  const db = await freshDatabase();
  const spy = capturingPool(db.url);
  try {
    await db.sql`insert into tenants
                 select 't' || lpad(g::text, 2, '0') from generate_series(0, ${TENANTS - 1}) g`;
    await addRuns(db.sql as Sql, 1, 3_000);
    await countSlots(db.sql as Sql);
    const s = await sample(db.sql as Sql);
    const found = new Map<string, Set<string>>();
    for (const st of [...hotStatements(s), ...otherStatements(s)]) {
      for (const stmt of await spy.capture(st.call)) {
        for (const mode of ["force_generic_plan", "force_custom_plan"] as const) {
          for (const scan of unscoped(await explain(db.sql, stmt, mode))) {
            if (!found.has(st.name)) found.set(st.name, new Set());
            found.get(st.name)!.add(scan);
          }
        }
      }
    }
    const got = Object.fromEntries(
      [...found].map(([name, how]) => [name, [...how].sort()]).sort(),
    );
    const expected = Object.fromEntries(
      Object.entries(NOT_TENANT_SCOPED).map(([name, e]) => [name, [...e.via].sort()]).sort(),
    );
    assert.deepEqual(got, expected, "statements scanning runs or work_events without a tenant");
  } finally {
    await spy.sql.end();
    await db.drop();
  }
});
