/**
 * A Postgres server the bench starts for itself: `initdb` into a temporary
 * directory, its own port and settings (autovacuum, pg_stat_statements),
 * stopped and removed afterwards. The shared server (BENCH_ADMIN_URL) runs
 * with autovacuum off and must not be reconfigured; a section that needs
 * vacuum beside the queue, or `shared_preload_libraries`, uses one of these.
 * initdb refuses to run as root: as root, the server's commands run as the
 * `postgres` user (runuser), which owns the directory.
 */
import { freePort } from "../dev/processes.ts";
import { log } from "./run_context.ts";
import { sh } from "./tools.ts";

/** A running server of the bench's own. */
export interface OwnPostgres {
  /** postgres://postgres@127.0.0.1:<port>/postgres */
  adminUrl: string;
  port: number;
  /** The server's settings that differ from initdb's, as given. */
  settings: Record<string, string>;
  /** Stops the server (fast) and removes its directory. */
  stop(): Promise<void>;
}

/** The newest installed server's bin directory (/usr/lib/postgresql/<n>/bin). */
async function serverBin(): Promise<string> {
  const versions: string[] = [];
  try {
    for await (const e of Deno.readDir("/usr/lib/postgresql")) versions.push(e.name);
  } catch { /* none */ }
  for (const v of versions.sort((a, b) => Number(b) - Number(a))) {
    const bin = `/usr/lib/postgresql/${v}/bin`;
    if (await Deno.stat(`${bin}/initdb`).then(() => true, () => false)) return bin;
  }
  throw new Error(
    "initdb not found under /usr/lib/postgresql/<n>/bin (apt-get install postgresql)",
  );
}

/**
 * Starts a server of the bench's own with `settings` (postgresql.conf
 * lines, e.g. `autovacuum: "on"`), listening on 127.0.0.1 on a free port,
 * trust authentication, and returns once it answers.
 */
export async function startOwnPostgres(settings: Record<string, string>): Promise<OwnPostgres> {
  const bin = await serverBin();
  const root = (await sh("id", ["-u"])).stdout.trim() === "0";
  const dir = await Deno.makeTempDir({ prefix: "poimen-bench-pg-" });
  const data = `${dir}/data`;
  // As root, everything runs as `postgres`, which must own the directory.
  if (root) await sh("chown", ["postgres:", dir]);
  const as = (cmd: string, args: string[]) =>
    root
      ? sh("runuser", ["-u", "postgres", "--", `${bin}/${cmd}`, ...args])
      : sh(`${bin}/${cmd}`, args);
  await as("initdb", ["-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]);
  const port = freePort();
  const conf = {
    listen_addresses: "'127.0.0.1'",
    port: String(port),
    unix_socket_directories: `'${dir}'`,
    max_connections: "100",
    shared_buffers: "256MB",
    ...settings,
  };
  await Deno.writeTextFile(
    `${data}/postgresql.auto.conf`,
    Object.entries(conf).map(([k, v]) => `${k} = ${v}`).join("\n") + "\n",
  );
  await as("pg_ctl", ["-D", data, "-l", `${dir}/server.log`, "-w", "-t", "60", "start"]);
  log(`own Postgres on port ${port} (${dir}): ${JSON.stringify(settings)}`);
  return {
    adminUrl: `postgres://postgres@127.0.0.1:${port}/postgres`,
    port,
    settings,
    stop: async () => {
      await as("pg_ctl", ["-D", data, "-m", "fast", "-w", "stop"]).catch((e) => log(String(e)));
      await Deno.remove(dir, { recursive: true });
    },
  };
}
