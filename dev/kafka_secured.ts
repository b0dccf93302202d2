/**
 * The secured mode of the development broker (dev/kafka.ts): clients reach
 * it over `SASL_SSL` (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN, user
 * `poimen`) on its port and over `SSL` with a client certificate (mTLS) on
 * a second one; the controller listener stays plaintext on 127.0.0.1.
 *
 * Its TLS material is made with the JDK's keytool on the first secured
 * start, in `<dir>/tls/`, with the passwords in `<dir>/secured.json` (both
 * under the ignored Kafka folder): a CA (`ca.pem` is what clients trust), a
 * broker keystore signed by it with SANs localhost and 127.0.0.1, a client
 * certificate and key (`client.pem`, `client-key.pem`) for the mTLS
 * listener, and a CA that signed nothing (`other-ca.pem`), for tests of a
 * wrong CA. The SCRAM credentials are written into the storage when it is
 * formatted (`kafka-storage format --add-scram`).
 */
import type { KafkaSecurity } from "../kafka/security.ts";

const ROOT = decodeURIComponent(new URL("..", import.meta.url).pathname).replace(/\/$/, "");
const EXPORT_KEY = `${ROOT}/dev/kafka/ExportKey.java`;

/** The SASL user the secured broker knows (SCRAM and PLAIN). */
const SECURED_USER = "poimen";

/** What a secured broker's clients and configuration need, made once per broker directory. */
export interface SecuredMaterial {
  /** The directory holding the files below. */
  tlsDir: string;
  /** The CA clients trust (PEM). */
  caPem: string;
  /** A CA that signed nothing of this broker's (PEM). */
  otherCaPem: string;
  /** A client certificate the mTLS listener accepts (PEM), and its key. */
  clientCertPem: string;
  clientKeyPem: string;
  /** The password of every keystore (random, per directory). */
  storePassword: string;
  /** `SECURED_USER`'s password (random, per directory). */
  password: string;
}

async function run(cmd: string, args: string[], what: string): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  const text = new TextDecoder().decode(out.stdout);
  if (!out.success) {
    const err = new TextDecoder().decode(out.stderr).trim().split("\n").slice(-10).join("\n");
    throw new Error(`${what} failed (exit ${out.code}): ${err}`);
  }
  return text;
}

function randomHex(bytes: number): string {
  return Array.from(
    crypto.getRandomValues(new Uint8Array(bytes)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
}

/**
 * The secured material of broker directory `dir`, made on the first call
 * (about 15 keytool runs, some seconds); `secured.json` is written last, so
 * its presence means a complete set.
 */
export async function ensureSecuredMaterial(
  dir: string,
  report: (line: string) => void = () => {},
): Promise<SecuredMaterial> {
  const record = `${dir}/secured.json`;
  try {
    return JSON.parse(await Deno.readTextFile(record)) as SecuredMaterial;
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  const tlsDir = `${dir}/tls`;
  report(`making TLS material with keytool in ${tlsDir}`);
  await Deno.remove(tlsDir, { recursive: true }).catch(() => {});
  await Deno.mkdir(tlsDir, { recursive: true });
  const pass = randomHex(16);
  const store = (name: string) => ["-keystore", `${tlsDir}/${name}.p12`, "-storetype", "PKCS12"];
  const common = ["-storepass", pass, "-keypass", pass, "-noprompt"];
  const keytool = (what: string, ...args: string[]) =>
    run("keytool", [...args, ...common], `keytool ${what}`);
  const san = "SAN=dns:localhost,ip:127.0.0.1";

  const newCa = async (name: string) => {
    await keytool(
      `${name} key`,
      "-genkeypair",
      "-alias",
      "ca",
      "-keyalg",
      "RSA",
      "-keysize",
      "2048",
      "-validity",
      "3650",
      "-dname",
      `CN=poimen development ${name}`,
      "-ext",
      "bc:c",
      ...store(name),
    );
    await keytool(
      `${name} export`,
      "-exportcert",
      "-rfc",
      "-alias",
      "ca",
      ...store(name),
      "-file",
      `${tlsDir}/${name}.pem`,
    );
  };
  // A key pair in `name`.p12, signed by the CA, the chain imported back.
  const signed = async (name: string, dname: string, ext: string[]) => {
    await keytool(
      `${name} key`,
      "-genkeypair",
      "-alias",
      name,
      "-keyalg",
      "RSA",
      "-keysize",
      "2048",
      "-validity",
      "3650",
      "-dname",
      dname,
      ...ext,
      ...store(name),
    );
    await keytool(
      `${name} request`,
      "-certreq",
      "-alias",
      name,
      ...store(name),
      "-file",
      `${tlsDir}/${name}.csr`,
    );
    await keytool(
      `${name} sign`,
      "-gencert",
      "-rfc",
      "-alias",
      "ca",
      ...store("ca"),
      "-validity",
      "3650",
      ...ext,
      "-infile",
      `${tlsDir}/${name}.csr`,
      "-outfile",
      `${tlsDir}/${name}.pem`,
    );
    await keytool(
      `${name} import ca`,
      "-importcert",
      "-alias",
      "ca",
      ...store(name),
      "-file",
      `${tlsDir}/ca.pem`,
    );
    await keytool(
      `${name} import`,
      "-importcert",
      "-alias",
      name,
      ...store(name),
      "-file",
      `${tlsDir}/${name}.pem`,
    );
  };
  await newCa("ca");
  await newCa("other-ca");
  await signed("broker", "CN=localhost", ["-ext", san]);
  await signed("client", `CN=${SECURED_USER}`, []);
  // What the broker trusts: clients of the mTLS listener, and itself between its listeners.
  await keytool(
    "truststore",
    "-importcert",
    "-alias",
    "ca",
    ...store("truststore"),
    "-file",
    `${tlsDir}/ca.pem`,
  );
  const key = await run(
    "java",
    [EXPORT_KEY, `${tlsDir}/client.p12`, "client", pass],
    "export the client key",
  );
  await Deno.writeTextFile(`${tlsDir}/client-key.pem`, key, { mode: 0o600 });

  const material: SecuredMaterial = {
    tlsDir,
    caPem: `${tlsDir}/ca.pem`,
    otherCaPem: `${tlsDir}/other-ca.pem`,
    clientCertPem: `${tlsDir}/client.pem`,
    clientKeyPem: `${tlsDir}/client-key.pem`,
    storePassword: pass,
    password: randomHex(16),
  };
  await Deno.writeTextFile(record, JSON.stringify(material, null, 2) + "\n", { mode: 0o600 });
  return material;
}

/** The listener lines of a secured broker's server.properties. */
export function securedListenerProperties(
  ports: { port: number; sslPort: number; controllerPort: number },
  m: SecuredMaterial,
): string[] {
  const scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;";
  return [
    `listeners=SASL_SSL://127.0.0.1:${ports.port},SSL://127.0.0.1:${ports.sslPort},` +
    `CONTROLLER://127.0.0.1:${ports.controllerPort}`,
    `advertised.listeners=SASL_SSL://127.0.0.1:${ports.port},SSL://127.0.0.1:${ports.sslPort}`,
    "controller.listener.names=CONTROLLER",
    "listener.security.protocol.map=SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT",
    // Between the broker's own listeners: its certificate is its identity.
    "inter.broker.listener.name=SSL",
    `ssl.keystore.location=${m.tlsDir}/broker.p12`,
    "ssl.keystore.type=PKCS12",
    `ssl.keystore.password=${m.storePassword}`,
    `ssl.key.password=${m.storePassword}`,
    `ssl.truststore.location=${m.tlsDir}/truststore.p12`,
    "ssl.truststore.type=PKCS12",
    `ssl.truststore.password=${m.storePassword}`,
    "listener.name.ssl.ssl.client.auth=required",
    "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
    `listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=${scram}`,
    `listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=${scram}`,
    // PLAIN checks against the users listed here, not the SCRAM credentials.
    "listener.name.sasl_ssl.plain.sasl.jaas.config=" +
    "org.apache.kafka.common.security.plain.PlainLoginModule required " +
    `user_${SECURED_USER}="${m.password}";`,
  ];
}

/** The arguments of `kafka-storage format` that create the SCRAM credentials. */
export function scramFormatArgs(m: SecuredMaterial): string[] {
  return ["SCRAM-SHA-256", "SCRAM-SHA-512"].flatMap((mechanism) => [
    "--add-scram",
    `${mechanism}=[name=${SECURED_USER},password=${m.password}]`,
  ]);
}

/** How a client of the secured broker's SASL_SSL port connects (SCRAM-SHA-512). */
export function securedClientSecurity(m: SecuredMaterial): KafkaSecurity {
  return {
    tls: { ca: Deno.readTextFileSync(m.caPem) },
    sasl: { mechanism: "SCRAM-SHA-512", username: SECURED_USER, password: m.password },
  };
}

/**
 * The variables a poimen process needs to use the secured broker at
 * `address` over SASL_SSL with SCRAM-SHA-512, the CA given with DENO_CERT.
 */
export function securedProcessEnv(address: string, m: SecuredMaterial): Record<string, string> {
  return {
    KAFKA_BROKERS: address,
    KAFKA_SECURITY_PROTOCOL: "SASL_SSL",
    KAFKA_SASL_MECHANISM: "SCRAM-SHA-512",
    KAFKA_SASL_USERNAME: SECURED_USER,
    KAFKA_SASL_PASSWORD: m.password,
    DENO_CERT: m.caPem,
  };
}
