/**
 * The durable section (issue 30): what durable calls cost beside plain runs,
 * on one worker process (concurrency 16) hosting bench/hosted/durable.ts.
 *
 * - Throughput: the same number of runs of `echo` and of `bench.steps` (ten
 *   `ctx.step` calls each), admitted through the kernel, each drained from
 *   its first start to its last finish (Postgres clock); rounds alternate.
 *   Steps per second are ten times the second's runs per second.
 * - Resume latency: runs of `bench.signal` suspended on `ctx.waitForSignal`,
 *   then signalled one at a time (the API's statement and notify, paced),
 *   timed from the signal's commit to the end of the step after the wait;
 *   beside it, `echo` runs admitted one at a time at the same pace, timed
 *   from admission to their end. Both: a wake-up, a claim, a handler call,
 *   a write.
 */
import { Admission } from "../admission/admit.ts";
import { StaticCatalog } from "../admission/catalog.ts";
import { delay } from "../core/time.ts";
import { notifyChannels, QUEUE_CHANNEL } from "../db/notify.ts";
import { createPool, type Sql } from "../db/pool.ts";
import { registerVersions } from "../db/catalog.ts";
import { sendSignal } from "../db/signals.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { type BenchContext, check, log } from "./run_context.ts";
import { createDb } from "./scenario_support.ts";
import {
  admitAll,
  insertTenants,
  quantile,
  readyWorker,
  untilOrStalled,
} from "./queue_shape_support.ts";
import { hosted } from "./hosted/durable.ts";
import { CHILDREN_SCENARIOS, childrenRound } from "./children_section.ts";

/** The durable section's group of figures. */
export const DURABLE_GROUP = "durable";
/** Its scenarios, in report order. */
export const DURABLE_SCENARIOS = {
  plain: "echo runs",
  steps: "bench.steps runs (10 steps each)",
  admitToEnd: "echo run: admission → end",
  signalToStep: "bench.signal run: signal → next step's end",
} as const;

const TENANT = "durable";
const MODULE = "hosted/durable.ts";

/** Every round of the durable section. */
export async function durableSection(ctx: BenchContext, admin: Sql) {
  const { url, sql } = await createDb(ctx, admin, `poimen_bench_${ctx.stamp}_durable`);
  const registry = new WorkflowRegistry(hosted);
  await registerVersions(sql, registry.catalogVersions(), "bench");
  const kernelSql = createPool({ url, max: 4, applicationName: "bench-admit" });
  const kernel = new Admission(kernelSql, new StaticCatalog(registry.catalogVersions()), {
    maxBatch: 500,
    maxConcurrent: 2,
  });
  await insertTenants(sql, [TENANT]);
  const runs = ctx.quick ? 200 : 4_000;
  const paced = ctx.quick ? 40 : 300;
  try {
    for (let round = 1; round <= ctx.cfg.rounds; round++) {
      for (const [scenario, ref] of [["plain", "echo"], ["steps", "bench.steps"]] as const) {
        const [{ since }] = await sql<{ since: Date }[]>`select now() as since`;
        await admitAll(kernel, runs, (i) => ({
          tenant: TENANT,
          req: { workflow_ref: ref, input: { n: i } },
        }));
        const rate = await drain(ctx, sql, url, ref, runs, since);
        push(ctx, DURABLE_SCENARIOS[scenario], round, rate);
        log(`durable round ${round}: ${ref}: ${rate.toFixed(0)} runs/s`);
      }
      const latency = await resumeLatency(ctx, sql, url, kernel, paced, round);
      log(
        `durable round ${round}: admission → end p50 ${latency.plain[0].toFixed(1)} ms, ` +
          `signal → step p50 ${latency.signal[0].toFixed(1)} ms`,
      );
      const kids = await childrenRound(ctx, sql, url, kernel, TENANT, DURABLE_GROUP, round);
      log(
        `durable round ${round}: ${kids.perSecond.toFixed(0)} children admitted/s by ctx.map, ` +
          `parent's end after its last child p50 ${kids.wake[0].toFixed(1)} ms`,
      );
    }
  } finally {
    await kernelSql.end();
    await sql.end();
  }
}

function push(ctx: BenchContext, scenario: string, round: number, rate: number, p = [0, 0]) {
  ctx.figures.push({
    group: DURABLE_GROUP,
    scenario,
    conns: 16,
    round,
    rate,
    p50: p[0],
    p99: p[1],
  });
}

/** Runs of `ref` per second from the first start to the last finish, each once. */
async function drain(
  ctx: BenchContext,
  sql: Sql,
  url: string,
  ref: string,
  runs: number,
  since: Date,
) {
  const worker = await readyWorker(url, MODULE);
  const deadline = Date.now() + 900_000;
  try {
    await ctx.stats("worker").during(worker.pid, async () => {
      for (;;) {
        const [r] = await sql<{ busy: boolean }[]>`
          select exists (select 1 from runs where status = 'queued')
              or exists (select 1 from runs where status = 'running') as busy`;
        if (!r.busy) return;
        if (worker.exited || Date.now() > deadline) {
          throw new Error(`durable ${ref}: worker stalled:\n${worker.logs().join("\n")}`);
        }
        await delay(250);
      }
    });
  } finally {
    await worker.stop();
  }
  const [c] = await sql<{ n: number; once: number; s: number }[]>`
    select count(*)::int as n,
           count(*) filter (where attempts = 1 and status = 'succeeded')::int as once,
           extract(epoch from max(finished_at) - min(started_at))::float8 as s
      from runs
     where tenant_id = ${TENANT} and workflow_name = ${ref} and created_at >= ${since}`;
  check(
    c.n === runs && c.once === runs,
    `durable ${ref}: ${c.once} of ${c.n} runs succeeded on their first attempt`,
  );
  return runs / c.s;
}

/**
 * p50/p99 in ms of `echo` runs admitted one at a time (admission → end) and
 * of suspended `bench.signal` runs signalled one at a time (signal → end of
 * the step after the wait), on one ready worker; pushed as figures.
 */
async function resumeLatency(
  ctx: BenchContext,
  sql: Sql,
  url: string,
  kernel: Admission,
  n: number,
  round: number,
): Promise<{ plain: number[]; signal: number[] }> {
  const worker = await readyWorker(url, MODULE);
  try {
    const stamp = `r${round}-${ctx.stamp}`;
    // Suspended first, all of them, so the signals meet waiting runs only.
    const ids: string[] = [];
    for (let i = 0; i < n; i++) {
      const r = await kernel.admit(
        { workflow_ref: "bench.signal", input: { n: i }, dispatch_key: `${stamp}-sig-${i}` },
        { tenantId: TENANT, source: "bench", entry: "http" },
      );
      ids.push(r.run.run_id);
    }
    await untilOrStalled(
      worker,
      async () => {
        const [w] = await sql<{ n: number }[]>`
        select count(*)::int as n from runs
         where tenant_id = ${TENANT} and run_id = any(${ids}::uuid[]) and status = 'waiting'`;
        return w.n === n;
      },
      "the signal runs to suspend",
      300_000,
    );
    const plainIds: string[] = [];
    for (let i = 0; i < n; i++) {
      const r = await kernel.admit(
        { workflow_ref: "echo", input: { n: i }, dispatch_key: `${stamp}-echo-${i}` },
        { tenantId: TENANT, source: "bench", entry: "http" },
      );
      plainIds.push(r.run.run_id);
      // As the API does after an admission.
      await notifyChannels(sql, [QUEUE_CHANNEL]);
      await delay(20);
    }
    for (const id of ids) {
      await sendSignal(sql, TENANT, id, { name: "go", signal_id: `${stamp}-go`, payload: {} });
      await notifyChannels(sql, [QUEUE_CHANNEL]);
      await delay(20);
    }
    await untilOrStalled(
      worker,
      async () => {
        const [d] = await sql<{ n: number }[]>`
        select count(*)::int as n from runs
         where tenant_id = ${TENANT} and run_id = any(${[...ids, ...plainIds]}::uuid[])
           and status = 'succeeded'`;
        return d.n === 2 * n;
      },
      "every latency run to succeed",
      300_000,
    );
    const plain = (await sql<{ ms: number }[]>`
      select extract(epoch from finished_at - created_at)::float8 * 1000 as ms from runs
       where tenant_id = ${TENANT} and run_id = any(${plainIds}::uuid[])`).map((r) => r.ms);
    const signal = (await sql<{ ms: number }[]>`
      select extract(epoch from st.completed_at - sg.received_at)::float8 * 1000 as ms
        from run_signals sg
        join run_steps st on st.tenant_id = sg.tenant_id and st.run_id = sg.run_id
                         and st.name = 'after'
       where sg.tenant_id = ${TENANT} and sg.run_id = any(${ids}::uuid[])`).map((r) => r.ms);
    check(signal.length === n, `durable: ${signal.length} of ${n} signalled runs resumed`);
    const p = (xs: number[]) => [quantile(xs, 0.5), quantile(xs, 0.99)];
    push(ctx, DURABLE_SCENARIOS.admitToEnd, round, 0, p(plain));
    push(ctx, DURABLE_SCENARIOS.signalToStep, round, 0, p(signal));
    return { plain: p(plain), signal: p(signal) };
  } finally {
    await worker.stop();
  }
}

/** The report's lines for the durable section; empty when it did not run. */
export function durableReport(ctx: BenchContext): string[] {
  const figs = ctx.figures.filter((f) => f.group === DURABLE_GROUP);
  if (figs.length === 0) return [];
  const of = (s: string) => figs.filter((f) => f.scenario === s);
  const med = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
  };
  const plain = med(of(DURABLE_SCENARIOS.plain).map((f) => f.rate));
  const steps = med(of(DURABLE_SCENARIOS.steps).map((f) => f.rate));
  const row = (s: string) => {
    const f = of(s);
    return `| ${s} | ${med(f.map((x) => x.p50)).toFixed(1)} | ${
      med(f.map((x) => x.p99)).toFixed(1)
    } | ${f.map((x) => `${x.p50.toFixed(1)}/${x.p99.toFixed(1)}`).join(" · ")} |`;
  };
  const rounds = (s: string) => of(s).map((f) => f.rate.toFixed(0)).join(" / ");
  return [
    `## Durable runs: steps, resume latency, children (issues 30, 31)`,
    ``,
    `One worker process (concurrency 16) hosting bench/hosted/durable.ts. Throughput: the same ` +
    `number of runs of \`echo\` and of \`bench.steps\` (ten \`ctx.step\` calls each, every ` +
    `result stored in its own fenced statement), admitted through the kernel, drained from ` +
    `first start to last finish (Postgres clock). Latency: suspended \`bench.signal\` runs ` +
    `signalled one every 20 ms (the API's statement and notify), from the signal's commit to ` +
    `the end of the step after the wait, beside \`echo\` runs admitted one every 20 ms, from ` +
    `admission to their end.`,
    ``,
    `| runs | runs/s (median) | rounds | steps/s | ÷ echo runs/s |`,
    `|---|---:|---|---:|---:|`,
    `| ${DURABLE_SCENARIOS.plain} | ${plain.toFixed(0)} | ${
      rounds(DURABLE_SCENARIOS.plain)
    } | — | 1.00 |`,
    `| ${DURABLE_SCENARIOS.steps} | ${steps.toFixed(0)} | ${rounds(DURABLE_SCENARIOS.steps)} | ${
      (10 * steps).toFixed(0)
    } | ${(steps / plain).toFixed(2)} |`,
    ``,
    `| latency | p50 ms (median) | p99 ms (median) | rounds (p50/p99) |`,
    `|---|---:|---:|---|`,
    row(DURABLE_SCENARIOS.admitToEnd),
    row(DURABLE_SCENARIOS.signalToStep),
    ``,
    `Child runs (issue 31): one \`bench.fanout\` parent mapping ${
      ctx.quick ? "1,000" : "10,000"
    } \`echo\` children (\`ctx.map\`), from the parent's first start to its last child's ` +
    `admission, the worker running the children meanwhile; and parents of five children each, ` +
    `admitted one every 50 ms, from the last child's end (the statement that wakes the parent) ` +
    `to the parent's end (a claim, the replay of its map, its completion).`,
    ``,
    `| children | per s (median) | rounds |`,
    `|---|---:|---|`,
    `| ${CHILDREN_SCENARIOS.admitted} | ${
      med(of(CHILDREN_SCENARIOS.admitted).map((f) => f.rate)).toFixed(0)
    } | ${rounds(CHILDREN_SCENARIOS.admitted)} |`,
    ``,
    `| latency | p50 ms (median) | p99 ms (median) | rounds (p50/p99) |`,
    `|---|---:|---:|---|`,
    row(CHILDREN_SCENARIOS.wake),
    ``,
  ];
}
