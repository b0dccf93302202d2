/**
 * TLS on the local Postgres, for the tests that connect with
 * `sslmode=verify-full`. Our server runs with `ssl = off`; this makes a CA
 * and a server certificate for `localhost` and 127.0.0.1 (once: kept in
 * `TLS_DIR`, which the server must be able to read after a restart too),
 * points the server at them with `ALTER SYSTEM` and reloads it. Plaintext
 * connections keep working for everything else (pg_hba's `host` lines take
 * both). Needs `openssl`, and root to give the key to the postgres user.
 */
import { ADMIN_URL } from "./db.ts";
import { createPool } from "../../db/pool.ts";

/** Where the certificates live: beside the server's data, not in /tmp, which may be cleared. */
export const TLS_DIR = "/var/lib/postgresql/poimen-tls";

/** The files a client needs: the CA that signed the server, and one that did not. */
export interface PostgresTls {
  caFile: string;
  otherCaFile: string;
}

async function run(cmd: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
  }
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

async function makeCertificates(): Promise<void> {
  await Deno.mkdir(TLS_DIR, { recursive: true });
  const f = (name: string) => `${TLS_DIR}/${name}`;
  const req = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650"];
  await run("openssl", [
    ...req,
    "-keyout",
    f("ca.key"),
    "-out",
    f("ca.pem"),
    "-subj",
    "/CN=poimen test CA",
  ]);
  await run("openssl", [
    ...req,
    "-keyout",
    f("other-ca.key"),
    "-out",
    f("other-ca.pem"),
    "-subj",
    "/CN=another CA",
  ]);
  await run("openssl", [
    "req",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-keyout",
    f("server.key"),
    "-out",
    f("server.csr"),
    "-subj",
    "/CN=localhost",
  ]);
  await Deno.writeTextFile(
    f("server.ext"),
    "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n" +
      "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
  );
  await run("openssl", [
    "x509",
    "-req",
    "-in",
    f("server.csr"),
    "-CA",
    f("ca.pem"),
    "-CAkey",
    f("ca.key"),
    "-CAcreateserial",
    "-out",
    f("server.pem"),
    "-days",
    "3650",
    "-extfile",
    f("server.ext"),
  ]);
  // Postgres refuses a key others can read, and must own it to read it.
  await run("chown", ["postgres:postgres", f("server.key"), f("server.pem")]);
  await Deno.chmod(f("server.key"), 0o600);
}

let ready: Promise<PostgresTls> | undefined;

/** Turns TLS on for the local server (idempotent); resolves with the client's files. */
export function ensurePostgresTls(): Promise<PostgresTls> {
  return ready ??= (async () => {
    if (!(await exists(`${TLS_DIR}/server.key`))) await makeCertificates();
    const sql = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test-tls" });
    try {
      const [{ ssl, cert, key }] = await sql<{ ssl: string; cert: string; key: string }[]>`
        select current_setting('ssl') as ssl, current_setting('ssl_cert_file') as cert,
               current_setting('ssl_key_file') as key`;
      const want = { cert: `${TLS_DIR}/server.pem`, key: `${TLS_DIR}/server.key` };
      if (ssl !== "on" || cert !== want.cert || key !== want.key) {
        await sql.unsafe(`alter system set ssl_cert_file = '${want.cert}'`);
        await sql.unsafe(`alter system set ssl_key_file = '${want.key}'`);
        await sql`alter system set ssl = on`;
        await sql`select pg_reload_conf()`;
        // The reload is asynchronous: wait until new sessions see it.
        for (let i = 0; i < 100; i++) {
          const probe = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test-tls" });
          const [{ on }] = await probe<{ on: string }[]>`select current_setting('ssl') as on`;
          await probe.end();
          if (on === "on") break;
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    } finally {
      await sql.end();
    }
    return { caFile: `${TLS_DIR}/ca.pem`, otherCaFile: `${TLS_DIR}/other-ca.pem` };
  })();
}
