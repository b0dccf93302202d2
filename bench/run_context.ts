/**
 * One `deno task bench` run's settings and what it collects: every section
 * takes the context and adds its figures, process accounting, wait-event
 * samples and notes to it; the report is written from it at the end.
 */
import { PROJECT_ROOT } from "../dev/tasks.ts";
import { ProcStats } from "./tools.ts";

/** The sections `--only` chooses among, in the order a run measures them. */
export const SECTIONS = [
  "http",
  "growth",
  "worker",
  "spread",
  "idle",
  "claim",
  "wait",
  "relay",
  "durable",
  "soak",
] as const;
/** The sections of issue 28's measurements, which need no competitor's tools. */
export const SHAPE_SECTIONS = ["spread", "idle", "claim", "soak"] as const;
/** One of {@link SECTIONS}. */
export type Section = typeof SECTIONS[number];

/** Durations and sizes of a run: the full one, or `--quick`'s smoke run. */
export interface BenchConfig {
  /** Seconds per measurement. */
  secs: number;
  /** Seconds of warm-up before each. */
  warm: number;
  rounds: number;
  /** Existing runs the growth section admits at. */
  sizes: number[];
  workerJobs: number;
  relayDrain: number;
  relaySecs: number;
  /** The queue's shape (issue 28): sizes of the spread, idle, claim and soak sections. */
  shape: ShapeConfig;
}

/**
 * Sizes of the sections that measure the queue's cost against what waits
 * beside the due work (issue 28); each can be set on the command line.
 */
export interface ShapeConfig {
  /** Runs each spread scenario admits and drains. */
  spreadRuns: number;
  /** Tenants the spread section spreads them over (1 always measured first). */
  tenants: number[];
  /** Versions the hosted-versions scenarios' worker hosts (echo and no-ops). */
  hostedVersions: number[];
  /** Not-due groups the idle section puts beside one key's due runs (0 always measured). */
  idleGroups: number[];
  /** Due runs of the one key the idle section drains. */
  keyRuns: number;
  /** How long the idle section waits for them before it reports "not drained". */
  drainDeadlineSecs: number;
  /** Queued runs of the claim section (running and tenants: 1% of it each, at most 10,000). */
  claimQueued: number;
  /** Claims sampled per statement and state. */
  claimSamples: number;
  /** Runs that pass through the soak. */
  soakRuns: number;
}

/** The shape sizes of a full run, or of a `--quick` one. */
function shapeConfig(quick: boolean): ShapeConfig {
  return {
    spreadRuns: quick ? 2_000 : 20_000,
    tenants: quick ? [1, 200, 2_000] : [1, 200, 2_000, 10_000],
    hostedVersions: [3, 30],
    idleGroups: quick ? [0, 1_000] : [0, 1_000, 10_000],
    keyRuns: 40,
    drainDeadlineSecs: quick ? 30 : 120,
    claimQueued: quick ? 100_000 : 1_000_000,
    claimSamples: quick ? 50 : 100,
    soakRuns: quick ? 20_000 : DEFAULT_SOAK_RUNS,
  };
}

/** Runs through the soak of a full run: about 5 minutes on a 2-core machine. */
export const DEFAULT_SOAK_RUNS = 200_000;

/** The configuration of a full run, or of a `--quick` one. */
function benchConfig(quick: boolean): BenchConfig {
  return quick
    ? {
      secs: 2,
      warm: 1,
      rounds: 1,
      sizes: [0, 20_000],
      workerJobs: 2_000,
      relayDrain: 2_000,
      relaySecs: 3,
      shape: shapeConfig(true),
    }
    : {
      secs: 8,
      warm: 2,
      rounds: 2,
      sizes: [0, 100_000, 1_000_000],
      workerJobs: 20_000,
      relayDrain: 20_000,
      relaySecs: 10,
      shape: shapeConfig(false),
    };
}

/** Connections (or concurrent callers) of every HTTP and enqueue scenario. */
export const CONNS = [16, 64];
/** Size of the fixed key set replays cycle through. */
export const REPLAY_KEYS = 50;
/** The wrk script of every HTTP scenario. */
export const LUA = `${PROJECT_ROOT}bench/wrk/admit.lua`;

/** One measurement. Rates per second, latencies in ms. */
export interface Figure {
  group: string;
  scenario: string;
  conns: number;
  round: number;
  rate: number;
  p50: number;
  p99: number;
  /** Cores the measured process used, and its CPU per operation in µs. */
  cores?: number;
  usPerOp?: number;
}

/**
 * One round of the wait section: callers held on `Prefer: wait=N` while
 * their runs finish, and what that cost the API process. Delays in ms.
 */
export interface WaitFigure {
  round: number;
  waiters: number;
  /** The sleeps' longest `ms`, and the `Prefer: wait` asked for (s). */
  maxSleepMs: number;
  waitSeconds: number;
  /** Answered 200 with a final run and `Preference-Applied`. */
  answeredFinal: number;
  /** Each run's `finished_at` (Postgres) to its waiter's answer (its own process). */
  p50: number;
  p99: number;
  max: number;
  /** From the first run's finish to the last's, s. */
  finishSpan: number;
  /** The API's CPU over the whole measurement, and while the waits were being opened. */
  apiCpu: number;
  apiCpuOpening: number;
  /** The measurement's wall time, s. */
  wall: number;
  /** The API's peak RSS (VmHWM) at its start and at the end of the measurement, MB. */
  apiRssStart: number;
  apiRssPeak: number;
  /** The waiting callers' own process. */
  clientCpu: number;
}

/** One key's due runs drained behind `idle` not-due groups (the idle section). */
export interface DrainFigure {
  round: number;
  idle: number;
  /** The key's first admission to its last finish (Postgres clock), s; undefined: not drained. */
  seconds?: number;
  done: number;
  of: number;
}

/** One statement's sampled claims in one state (the claim section). */
export interface ClaimFigure {
  statement: string;
  state: string;
  samples: number;
  p50: number;
  p99: number;
  /** Shared buffers hit or read per claim (pg_stat_statements), median and p99. */
  buffersP50: number;
  buffersP99: number;
  /** Runs a claim took, median. */
  claimed: number;
}

/** One window of the soak. */
export interface SoakSample {
  /** Seconds since the soak started. */
  at: number;
  /** Runs finished so far, and queued at the sample. */
  finished: number;
  queued: number;
  /** Rolled-back probe claims during the window, ms. */
  claimP50: number;
  claimP99: number;
  /** Sizes in MB: runs' heap, runs' indexes, work_events' heap and indexes. */
  runsMb: number;
  runsIndexMb: number;
  eventsMb: number;
  /** Autovacuum and autoanalyze runs on `runs` so far. */
  autovacuums: number;
  autoanalyzes: number;
  /** Runs the retention purge deleted so far. */
  purged: number;
}

/** What the shape sections measured beside the figures. */
export interface ShapeResults {
  drains: DrainFigure[];
  claims: ClaimFigure[];
  soak: SoakSample[];
  /** The soak's own Postgres settings and its runs, for the report. */
  soakSetup?: { runs: number; seconds: number; settings: Record<string, string>; rate: number };
  claimSetup?: { queued: number; running: number; tenants: number };
}

/** What a run was asked for and where its tools are. */
export interface BenchOptions {
  quick: boolean;
  /** `--only`'s sections; undefined: all of them, and the report is written. */
  only?: ReadonlySet<Section>;
  /** The Postgres server's admin URL; every database of the run is created next to it. */
  adminUrl: string;
  /** Paths of wrk and pgbench. */
  wrk: string;
  pgbench: string;
  /** Sizes of the shape sections set on the command line, over the run's defaults. */
  shape?: Partial<ShapeConfig>;
}

/** A run's settings and everything it has measured so far. */
export class BenchContext {
  readonly quick: boolean;
  readonly only?: ReadonlySet<Section>;
  readonly cfg: BenchConfig;
  readonly adminUrl: string;
  readonly wrk: string;
  readonly pgbench: string;
  /** In every database, key prefix, tenant and group name of the run, so runs never collide. */
  readonly stamp = Date.now().toString(36);
  readonly figures: Figure[] = [];
  readonly procs = new Map<string, ProcStats>();
  /** Per scenario label, how often each wait event was seen (and "(samples)": how often sampled). */
  readonly waits = new Map<string, Map<string, number>>();
  readonly notes: string[] = [];
  /** The wait section's rounds. */
  readonly waiting: WaitFigure[] = [];
  /** The idle, claim and soak sections' measurements (bench/queue_shape_report.ts). */
  readonly shape: ShapeResults = { drains: [], claims: [], soak: [] };

  constructor(options: BenchOptions) {
    this.quick = options.quick;
    this.only = options.only;
    const cfg = benchConfig(options.quick);
    this.cfg = { ...cfg, shape: { ...cfg.shape, ...options.shape } };
    this.adminUrl = options.adminUrl;
    this.wrk = options.wrk;
    this.pgbench = options.pgbench;
  }

  /** Whether `section` is measured in this run. */
  wanted(section: Section): boolean {
    return !this.only || this.only.has(section);
  }

  /** The accounting of the process called `name`, created on first use. */
  stats(name: string): ProcStats {
    let s = this.procs.get(name);
    if (!s) this.procs.set(name, s = new ProcStats(name));
    return s;
  }
}

/** Progress on stderr; stdout carries only the report. */
export function log(msg: string) {
  console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${msg}`);
}

/** Fails the bench: a count that is not what exactly-once demands. */
export function check(ok: boolean, what: string): void {
  if (!ok) throw new Error(`correctness check failed: ${what}`);
}

/** The `p` quantile of ascending `sorted` (0 when empty). */
export function q(sorted: number[], p: number): number {
  return sorted.length === 0
    ? 0
    : sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}
