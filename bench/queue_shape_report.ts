/**
 * The report's part for the queue-shape sections (issue 28): worker runs/s
 * over tenants and hosted versions beside the one-tenant figure, one key's
 * drain behind not-due groups beside none, claim latency and buffers at a
 * large queue, and the soak's table and chart. Empty when none ran.
 */
import type { BenchContext, SoakSample } from "./run_context.ts";
import { SPREAD_GROUP, spreadScenario } from "./spread_section.ts";

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

const n0 = (x: number) => Number.isNaN(x) ? "—" : Math.round(x).toLocaleString("en");
const fixed = (x: number, d = 2) => Number.isNaN(x) ? "—" : x.toFixed(d);
const goal = (ok: boolean) => ok ? "yes" : "**no**";

/** The markdown lines of the queue-shape sections that ran. */
export function queueShapeReport(ctx: BenchContext): string[] {
  return [...spread(ctx), ...drains(ctx), ...claims(ctx), ...soak(ctx)];
}

function spread(ctx: BenchContext): string[] {
  const figs = ctx.figures.filter((f) => f.group === SPREAD_GROUP);
  if (figs.length === 0) return [];
  const scenarios = [...new Set(figs.map((f) => f.scenario))];
  const rate = (s: string) => median(figs.filter((f) => f.scenario === s).map((f) => f.rate));
  const base = rate(spreadScenario(1));
  return [
    `## Worker runs/s as tenants and hosted versions grow (issue 28)`,
    ``,
    `${ctx.cfg.shape.spreadRuns.toLocaleString("en")} \`echo\` runs admitted through the kernel ` +
    `each time, then one worker process (concurrency 16) from its first start to its last ` +
    `finish (Postgres clock); the hosted-versions rows host \`echo\` and no-op versions ` +
    `(bench/hosted/). Goal: flat, ≥ 0.9 × the one-tenant figure at 10,000 tenants.`,
    ``,
    `| runs spread over | runs/s (median) | rounds | ÷ 1 tenant | ≥ 0.9 |`,
    `|---|---:|---|---:|---|`,
    ...scenarios.map((s) => {
      const r = rate(s);
      const rounds = figs.filter((f) => f.scenario === s).map((f) => f.rate.toFixed(0));
      return `| ${s} | ${n0(r)} | ${rounds.join(" / ")} | ${fixed(r / base)} | ${
        goal(r / base >= 0.9)
      } |`;
    }),
    ``,
  ];
}

function drains(ctx: BenchContext): string[] {
  const all = ctx.shape.drains;
  if (all.length === 0) return [];
  const shape = ctx.cfg.shape;
  const counts = [...new Set(all.map((d) => d.idle))];
  const secs = (idle: number) => {
    const mine = all.filter((d) => d.idle === idle);
    // Not drained counts as the deadline: the median is then a floor.
    return median(mine.map((d) => d.seconds ?? shape.drainDeadlineSecs));
  };
  const base = secs(0);
  return [
    `## One key's due runs behind not-due groups (issue 28)`,
    ``,
    `${shape.keyRuns} due runs of one key of \`bench.keyed\` (at most 1 running per key), admitted ` +
    `while a ready worker (concurrency 16) waits, beside N other keys of the same tenant each ` +
    `holding one run due tomorrow; from the key's first admission to its last finish (Postgres ` +
    `clock). A database per scenario. Deadline ${shape.drainDeadlineSecs} s: a key not drained ` +
    `by then shows how many of its runs had finished. Goal: the same as with none.`,
    ``,
    `| not-due groups beside | drain s (median) | rounds | ÷ none |`,
    `|---:|---:|---|---:|`,
    ...counts.map((idle) => {
      const rounds = all.filter((d) => d.idle === idle).map((d) =>
        d.seconds === undefined
          ? `not drained: ${d.done} of ${d.of} after ${shape.drainDeadlineSecs} s`
          : d.seconds.toFixed(2)
      );
      const allDrained = all.every((d) => d.idle !== idle || d.seconds !== undefined);
      return `| ${idle.toLocaleString("en")} | ${allDrained ? "" : "> "}${fixed(secs(idle))} | ${
        rounds.join(" / ")
      } | ${fixed(secs(idle) / base)} |`;
    }),
    ``,
  ];
}

function claims(ctx: BenchContext): string[] {
  const all = ctx.shape.claims;
  const setup = ctx.shape.claimSetup;
  if (all.length === 0 || !setup) return [];
  return [
    `## Claim latency and buffers at a large queue (issue 28)`,
    ``,
    `${setup.queued.toLocaleString("en")} queued runs over ${
      setup.tenants.toLocaleString("en")
    } tenants (each tenant's tenth: 7 \`echo\` due tomorrow, 1 \`bench.keyed\` in a key of its ` +
    `own, the tenant's first due now and the rest tomorrow, 1 \`sleep\` due now that the ` +
    `claimer does not host, 1 \`echo\` due now), ${
      setup.running.toLocaleString("en")
    } of them running under a long lease, all admitted and claimed by the product's own ` +
    `statements, on a Postgres of the bench's own (pg_stat_statements loaded, autovacuum off). ` +
    `Each sample: one call of the db/claims.ts function as the worker makes it (up to 16 runs) ` +
    `in a transaction rolled back; time of the call, shared buffers hit or read by everything ` +
    `it ran (pg_stat_statements).`,
    ``,
    `| claim | statistics | samples | p50 ms | p99 ms | buffers p50 | buffers p99 | runs claimed (median) |`,
    `|---|---|---:|---:|---:|---:|---:|---:|`,
    ...all.map((c) =>
      `| ${c.statement} | ${c.state} | ${c.samples} | ${fixed(c.p50)} | ${fixed(c.p99)} | ${
        n0(c.buffersP50)
      } | ${n0(c.buffersP99)} | ${c.claimed} |`
    ),
    ``,
  ];
}

/** At most `max` of `xs`, evenly spread, always the last. */
function thin<T>(xs: T[], max: number): T[] {
  if (xs.length <= max) return xs;
  const step = xs.length / max;
  const out = Array.from({ length: max - 1 }, (_, i) => xs[Math.floor(i * step)]);
  return [...out, xs[xs.length - 1]];
}

/** A text bar chart of `value` over the samples, one line each. */
function asciiChart(
  samples: SoakSample[],
  label: string,
  value: (s: SoakSample) => number,
  unit: string,
  width = 40,
): string[] {
  const top = Math.max(...samples.map(value), 1e-9);
  return [
    `${label} (full bar = ${top.toFixed(1)} ${unit})`,
    ...samples.map((s) => {
      const v = value(s);
      const bar = "█".repeat(Math.round((v / top) * width));
      return `${s.at.toFixed(0).padStart(6)} s |${bar.padEnd(width)}| ${v.toFixed(1)}`;
    }),
  ];
}

function soak(ctx: BenchContext): string[] {
  const setup = ctx.shape.soakSetup;
  const all = ctx.shape.soak;
  if (!setup || all.length === 0) return [];
  const rows = thin(all, 30);
  return [
    `## Soak: autovacuum on, retention on (issue 28)`,
    ``,
    `${setup.runs.toLocaleString("en")} runs passed through in ${setup.seconds.toFixed(0)} s ` +
    `(${setup.rate.toFixed(0)}/s; \`--soak-runs\` sets N, the issue asks for 10,000,000) on a ` +
    `Postgres of the bench's own: ${
      Object.entries(setup.settings).map(([k, v]) => `${k}=${v.replaceAll("'", "")}`).join(", ")
    }, the rest initdb's defaults. \`echo\` runs over 100 tenants admitted through the kernel ` +
    `(a backlog of a few thousand kept queued), one worker process (concurrency 16), the ` +
    `outbox's statements marking events published (no Kafka) and the retention purge ` +
    `(db/retention.ts) deleting runs 30 s after they finished. Claim latency: probe claims of ` +
    `db/claims.ts, rolled back, every 250 ms beside the worker's; sizes from pg_relation_size.`,
    ``,
    `| s | finished | queued | claim p50 ms | claim p99 ms | runs MB | runs indexes MB | work_events MB | purged | autovacuum / autoanalyze on runs |`,
    `|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|`,
    ...rows.map((s) =>
      `| ${s.at.toFixed(0)} | ${n0(s.finished)} | ${n0(s.queued)} | ${fixed(s.claimP50)} | ${
        fixed(s.claimP99)
      } | ${fixed(s.runsMb, 1)} | ${fixed(s.runsIndexMb, 1)} | ${fixed(s.eventsMb, 1)} | ${
        n0(s.purged)
      } | ${s.autovacuums} / ${s.autoanalyzes} |`
    ),
    ``,
    "```text",
    ...asciiChart(rows, "claim p99, ms", (s) => s.claimP99, "ms"),
    ``,
    ...asciiChart(rows, "runs indexes, MB", (s) => s.runsIndexMb, "MB"),
    "```",
    ``,
  ];
}
