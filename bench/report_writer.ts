/**
 * bench/REPORT.md from a run's context: every figure per round and its
 * median, the ratios against the targets of issue 12, peak RSS and CPU per
 * process, and Postgres wait events during admission.
 */
import { loadAvg } from "./tools.ts";
import { type BenchContext, CONNS, type Figure, REPLAY_KEYS } from "./run_context.ts";
import { cpuModel } from "./machine_facts.ts";
import { waitReport } from "./wait_section.ts";
import { queueShapeReport } from "./queue_shape_report.ts";
import { durableReport } from "./durable_section.ts";

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0
    ? NaN
    : s.length % 2
    ? s[(s.length - 1) / 2]
    : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

interface Row {
  group: string;
  scenario: string;
  conns: number;
  rate: number;
  rates: number[];
  p50: number;
  p99: number;
  cores?: number;
  usPerOp?: number;
}

function aggregate(ctx: BenchContext): Row[] {
  const rows = new Map<string, Row & { all: Figure[] }>();
  for (const f of ctx.figures) {
    const key = `${f.group}|${f.scenario}|${f.conns}`;
    const r = rows.get(key) ?? { ...f, rates: [], all: [] };
    r.all.push(f);
    rows.set(key, r);
  }
  return [...rows.values()].map((r) => ({
    group: r.group,
    scenario: r.scenario,
    conns: r.conns,
    rate: median(r.all.map((f) => f.rate)),
    rates: r.all.map((f) => f.rate),
    p50: median(r.all.map((f) => f.p50)),
    p99: median(r.all.map((f) => f.p99)),
    cores: r.all[0].cores === undefined ? undefined : median(r.all.map((f) => f.cores!)),
    usPerOp: r.all[0].usPerOp === undefined ? undefined : median(r.all.map((f) => f.usPerOp!)),
  }));
}

const fmt = (n: number | undefined, digits = 0) =>
  n === undefined || Number.isNaN(n) ? "—" : n.toFixed(digits);

/** The report's markdown, from what `ctx` collected since `started`. */
export async function report(
  ctx: BenchContext,
  started: { at: Date; load: string },
  versions: Record<string, string>,
): Promise<string> {
  const rows = aggregate(ctx);
  const find = (scenario: string, conns: number) =>
    rows.find((r) => r.scenario.startsWith(scenario) && r.conns === conns);
  const ratio = (a: Row | undefined, b: Row | undefined) => a && b ? a.rate / b.rate : NaN;
  const targets: [string, number, string, boolean][] = [];
  const target = (what: string, value: number, goal: number, shown = value.toFixed(2)) =>
    targets.push([what, value, `${shown} (target ≥ ${goal})`, value >= goal]);
  const targetMax = (what: string, value: number, goal: number, unit: string) =>
    targets.push([what, value, `${value.toFixed(1)} ${unit} (target ≤ ${goal})`, value <= goal]);
  for (const c of CONNS) {
    const mini = find("minimal endpoint", c);
    const nw = find("poimen POST /v1/runs, new keys", c);
    target(`admission new keys ÷ minimal endpoint, ${c} conns`, ratio(nw, mini), 1.0);
    target(
      `replays ÷ new keys, ${c} conns`,
      ratio(find("poimen POST /v1/runs, replays", c), nw),
      1.2,
    );
    target(
      `new keys ÷ pg-boss send, ${c} callers`,
      ratio(nw, find("pg-boss send, singletonKey, new", c)),
      2,
    );
    target(
      `new keys ÷ graphile-worker addJob, ${c} callers`,
      ratio(nw, find("graphile-worker addJob, jobKey, new", c)),
      2,
    );
    target(
      `replays ÷ pg-boss send (duplicates), ${c} callers`,
      ratio(find("poimen POST /v1/runs, replays", c), find("pg-boss send, singletonKey, dup", c)),
      2,
    );
    target(
      `replays ÷ graphile-worker addJob (duplicates), ${c} callers`,
      ratio(
        find("poimen POST /v1/runs, replays", c),
        find("graphile-worker addJob, jobKey, dup", c),
      ),
      2,
    );
  }
  const nw16 = find("poimen POST /v1/runs, new keys", 16);
  if (nw16) targetMax("admission new keys p99, 16 conns", nw16.p99, 10, "ms");
  const growthRows = rows.filter((r) => r.group === "growth");
  if (growthRows.length > 1) {
    const last = growthRows[growthRows.length - 1];
    target(
      `admission at ${last.scenario.match(/[\d,]+ existing/)?.[0]} runs ÷ empty table`,
      last.rate / growthRows[0].rate,
      0.9,
    );
  }
  const pw = rows.find((r) => r.scenario.startsWith("poimen worker"));
  const gw = rows.find((r) => r.scenario.startsWith("graphile-worker, concurrency"));
  if (pw && gw) target("poimen worker ÷ graphile-worker jobs/s", pw.rate / gw.rate, 1.5);
  const drain = rows.find((r) => r.scenario.startsWith("relay drain"));
  const nw64 = find("poimen POST /v1/runs, new keys", 64);
  if (drain && nw64) {
    // Issue 32: with batches, the relay drains at least as fast as direct single admission.
    target("relay drain ÷ direct HTTP admission (new keys, 64 conns)", drain.rate / nw64.rate, 1.0);
  }
  const toRun = rows.find((r) => r.scenario.startsWith("publish → run ("));
  const toEvent = rows.find((r) => r.scenario.startsWith("publish → run.admitted"));
  if (toRun) targetMax("publish → run p99", toRun.p99, 25, "ms");
  if (toEvent) targetMax("publish → run.admitted event p99", toEvent.p99, 100, "ms");
  for (const name of ["api", "relay", "worker", "outbox"]) {
    const p = ctx.procs.get(name);
    if (p && p.peakMb > 0) targetMax(`peak RSS ${name}`, p.peakMb, 150, "MB");
  }

  const cpu = await cpuModel();
  const table = (group: string, withConns = true) => {
    const list = rows.filter((r) => r.group === group);
    const head = `| scenario |${
      withConns ? " conns |" : ""
    } per s (median) | rounds | p50 ms | p99 ms | process cores | CPU µs/op |`;
    const sep = `|---|${withConns ? "---:|" : ""}---:|---|---:|---:|---:|---:|`;
    return [
      head,
      sep,
      ...list.map((r) =>
        `| ${r.scenario} |${withConns ? ` ${r.conns} |` : ""} ${fmt(r.rate)} | ${
          r.rates.map((x) => x.toFixed(0)).join(" / ")
        } | ${r.p50 ? fmt(r.p50, 1) : "—"} | ${r.p99 ? fmt(r.p99, 1) : "—"} | ${
          fmt(r.cores, 2)
        } | ${fmt(r.usPerOp)} |`
      ),
    ].join("\n");
  };
  const waitTable = [...ctx.waits].filter(([label]) => label.includes("new keys")).map(
    ([label, hist]) => {
      const samples = hist.get("(samples)") ?? 1;
      const list = [...hist].filter(([k]) => k !== "(samples)").sort((a, b) => b[1] - a[1]);
      return `- ${label}: ${
        list.slice(0, 6).map(([k, n]) => `${k} ${(n / samples).toFixed(2)}`).join(", ") ||
        "no active session sampled"
      } (mean active API sessions per sample, ${samples} samples)`;
    },
  );
  const lines = [
    `# poimen benchmark`,
    ``,
    `\`deno task bench${ctx.quick ? " -- --quick" : ""}\` · ${started.at.toISOString()} → ${
      new Date().toISOString()
    }`,
    ``,
    `Machine: ${navigator.hardwareConcurrency} cores (${cpu}), shared: load generator, every ` +
    `process and Postgres run on the same cores. Load average (1, 5, 15 min) at start ` +
    `${started.load}, at end ${loadAvg()}${
      Number(started.load.split(" ")[0]) > navigator.hardwareConcurrency
        ? " — other work was running: absolute figures are low and noisy; the ratios, from " +
          "alternating rounds, are what to read"
        : ""
    }.`,
    ``,
    `Versions: ${Object.entries(versions).map(([k, v]) => `${k} ${v}`).join(" · ")}.`,
    ``,
    `Method: ${ctx.cfg.secs} s per measurement after ${ctx.cfg.warm} s of warm-up, ${ctx.cfg.rounds} ` +
    `round(s), scenarios alternating within each round (A B A B…); the figure is the median ` +
    `of the rounds, each round's shown. HTTP load from wrk (2 threads, bench/wrk/admit.lua: a ` +
    `unique key per request from thread id and counter, or a fixed set of ${REPLAY_KEYS} keys ` +
    `for replays). pg-boss and graphile-worker run in process under Node, N concurrent ` +
    `callers = the connections column. Correctness is checked after every scenario: every key ` +
    `exactly once (rows per key, rows against answered requests); a wrong count fails the bench.`,
    ``,
    `## Targets (issue 12)`,
    ``,
    `| target | measured | met |`,
    `|---|---|---|`,
    ...targets.map(([what, , shown, ok]) => `| ${what} | ${shown} | ${ok ? "yes" : "**no**"} |`),
    ``,
    `## Admission over HTTP, and the same statement without HTTP`,
    ``,
    table("http"),
    ``,
    `## Enqueue with keys: pg-boss and graphile-worker`,
    ``,
    table("queues"),
    ``,
    `## Admission as the table grows, never analyzed`,
    ``,
    table("growth"),
    ``,
    `## Worker execution`,
    ``,
    table("worker", false),
    ``,
    ...queueShapeReport(ctx),
    ...durableReport(ctx),
    ...waitReport(ctx),
    `## Inbox relay`,
    ``,
    table("relay", false),
    ``,
    `## Processes: peak RSS and CPU`,
    ``,
    `| process | peak RSS MB | CPU s while measured | cores while measured |`,
    `|---|---:|---:|---:|`,
    ...[...ctx.procs.values()].map((p) =>
      `| ${p.name} | ${fmt(p.peakMb)} | ${p.wall ? fmt(p.cpu, 1) : "—"} | ${
        p.wall ? fmt(p.cpu / p.wall, 2) : "—"
      } |`
    ),
    ``,
    `## Postgres wait events during admission (sampled from pg_stat_activity)`,
    ``,
    ...waitTable,
    ``,
    ...(ctx.notes.length ? ["## Notes", "", ...ctx.notes.map((n) => `- ${n}`), ""] : []),
  ];
  return lines.join("\n");
}
