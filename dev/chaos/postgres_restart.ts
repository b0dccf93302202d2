/**
 * The `--pg-restart` fault of `deno task chaos`: the whole Postgres cluster
 * restarted at once, as a crash would, instead of its connections killed.
 */

/** `pg_ctlcluster <newest version> main restart -m immediate`, then waits until it answers. */
export async function restartPostgresCluster(): Promise<void> {
  const versions = [...Deno.readDirSync("/etc/postgresql")].map((e) => e.name).sort();
  const out = await new Deno.Command("pg_ctlcluster", {
    args: [
      "--skip-systemctl-redirect",
      versions[versions.length - 1],
      "main",
      "restart",
      "-m",
      "immediate",
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`pg_ctlcluster restart failed: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
}
