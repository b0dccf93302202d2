/**
 * How a Kafka client proves who it is and whom it talks to: TLS (the
 * broker's certificate verified against the trusted CAs and its name against
 * the host it was reached by; optionally a client certificate) and SASL
 * (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`), as `KafkaSecurity`, and the
 * options of @platformatic/kafka 2.12.1 it becomes.
 *
 * `securityFromEnv` reads it from the `KAFKA_SECURITY_PROTOCOL` … variables
 * (core/config.ts `kafkaEnv`), once at start-up: the PEM files named there
 * are read then (a missing or unreadable one is a `ConfigError` naming its
 * variable), so the process never reads a file afterwards.
 */
import { ConfigError } from "../core/errors.ts";

/** A SASL mechanism poimen speaks (Kafka's names). */
export type SaslMechanism = "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512";
/** Every `SaslMechanism`. */
export const SASL_MECHANISMS = [
  "PLAIN",
  "SCRAM-SHA-256",
  "SCRAM-SHA-512",
] as const satisfies readonly SaslMechanism[];

/** Kafka's `security.protocol` values. */
export const SECURITY_PROTOCOLS = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] as const;
/** One of `SECURITY_PROTOCOLS`. */
export type SecurityProtocol = typeof SECURITY_PROTOCOLS[number];

/** TLS settings of a client: PEM text, not file names. */
export interface KafkaTls {
  /**
   * CA certificates (PEM) the broker's certificate must chain to. Absent:
   * the runtime's trusted CAs, which under Deno include those of `DENO_CERT`.
   */
  ca?: string;
  /** A client certificate (PEM), for a broker that asks for one; with `key`. */
  cert?: string;
  /** The client certificate's private key (PEM). */
  key?: string;
}

/** SASL credentials of a client. */
export interface KafkaSasl {
  /** How the credentials are proven: `PLAIN` sends them (use it over TLS only), SCRAM does not. */
  mechanism: SaslMechanism;
  /** The user the broker knows. */
  username: string;
  /** Its password; never logged. */
  password: string;
}

/** How a client secures its connections; an empty object is plaintext, unauthenticated. */
export interface KafkaSecurity {
  /** Present: every connection is TLS (protocol `SSL` or `SASL_SSL`). */
  tls?: KafkaTls;
  /** Present: every connection authenticates (protocol `SASL_PLAINTEXT` or `SASL_SSL`). */
  sasl?: KafkaSasl;
}

/** The security variables of `kafkaEnv`, as validated there. */
export interface KafkaSecurityEnv {
  KAFKA_SECURITY_PROTOCOL: SecurityProtocol;
  KAFKA_SASL_MECHANISM?: SaslMechanism;
  KAFKA_SASL_USERNAME?: string;
  KAFKA_SASL_PASSWORD?: string;
  KAFKA_SSL_CA_FILE?: string;
  KAFKA_SSL_CERT_FILE?: string;
  KAFKA_SSL_KEY_FILE?: string;
}

/**
 * Why the security variables of `env` cannot work together, as
 * `[variable, problem]`, or undefined. Checked by `readEnv` for every schema
 * holding `KAFKA_SECURITY_PROTOCOL`: a setting that would be ignored is a
 * mistake too (SASL credentials under `SSL`, a CA file under `SASL_PLAINTEXT`).
 */
export function securityEnvProblem(env: KafkaSecurityEnv): [string, string] | undefined {
  const protocol = env.KAFKA_SECURITY_PROTOCOL;
  const sasl = protocol.startsWith("SASL_");
  const tls = protocol.endsWith("SSL");
  const saslVars = ["KAFKA_SASL_MECHANISM", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"] as const;
  for (const name of saslVars) {
    if (sasl && env[name] === undefined) {
      return [name, `required with KAFKA_SECURITY_PROTOCOL=${protocol}`];
    }
    if (!sasl && env[name] !== undefined) {
      return [
        name,
        `only read with KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT or SASL_SSL, not ${protocol}`,
      ];
    }
  }
  for (const name of ["KAFKA_SSL_CA_FILE", "KAFKA_SSL_CERT_FILE", "KAFKA_SSL_KEY_FILE"] as const) {
    if (!tls && env[name] !== undefined) {
      return [name, `only read with KAFKA_SECURITY_PROTOCOL=SSL or SASL_SSL, not ${protocol}`];
    }
  }
  if (env.KAFKA_SSL_CERT_FILE !== undefined && env.KAFKA_SSL_KEY_FILE === undefined) {
    return ["KAFKA_SSL_KEY_FILE", "required with KAFKA_SSL_CERT_FILE (the certificate's key)"];
  }
  if (env.KAFKA_SSL_KEY_FILE !== undefined && env.KAFKA_SSL_CERT_FILE === undefined) {
    return ["KAFKA_SSL_CERT_FILE", "required with KAFKA_SSL_KEY_FILE (the key's certificate)"];
  }
  return undefined;
}

/** What each PEM file must hold. */
const PEM_LABEL = {
  KAFKA_SSL_CA_FILE: /-----BEGIN CERTIFICATE-----/,
  KAFKA_SSL_CERT_FILE: /-----BEGIN CERTIFICATE-----/,
  KAFKA_SSL_KEY_FILE: /-----BEGIN (RSA |EC |ENCRYPTED )?PRIVATE KEY-----/,
} as const;

function readPem(name: keyof typeof PEM_LABEL, path: string): string {
  let text: string;
  try {
    text = Deno.readTextFileSync(path);
  } catch (error) {
    const why = error instanceof Deno.errors.NotCapable
      ? "not allowed to read it (the deno.json tasks may read /etc/poimen only; " +
        "see docs/kafka.md, or give the CA with DENO_CERT, which needs no permission)"
      : error instanceof Error
      ? error.message
      : String(error);
    throw new ConfigError(`config: ${name} is invalid: cannot read ${path}: ${why}`);
  }
  if (!PEM_LABEL[name].test(text)) {
    const what = name === "KAFKA_SSL_KEY_FILE" ? "unencrypted PEM private key" : "PEM certificates";
    throw new ConfigError(`config: ${name} is invalid: ${path} holds no ${what}`);
  }
  return text;
}

/**
 * The `KafkaSecurity` of validated variables, reading the PEM files they
 * name (at start-up: needs read permission on them). Throws a one-line
 * `ConfigError` naming the variable of a file that cannot be read or holds
 * no PEM of its kind.
 */
export function securityFromEnv(env: KafkaSecurityEnv): KafkaSecurity {
  const out: KafkaSecurity = {};
  const protocol = env.KAFKA_SECURITY_PROTOCOL;
  if (protocol === "SSL" || protocol === "SASL_SSL") {
    const tls: KafkaTls = {};
    if (env.KAFKA_SSL_CA_FILE) tls.ca = readPem("KAFKA_SSL_CA_FILE", env.KAFKA_SSL_CA_FILE);
    if (env.KAFKA_SSL_CERT_FILE) {
      tls.cert = readPem("KAFKA_SSL_CERT_FILE", env.KAFKA_SSL_CERT_FILE);
    }
    if (env.KAFKA_SSL_KEY_FILE) tls.key = readPem("KAFKA_SSL_KEY_FILE", env.KAFKA_SSL_KEY_FILE);
    out.tls = tls;
  }
  if (protocol === "SASL_PLAINTEXT" || protocol === "SASL_SSL") {
    // securityEnvProblem made sure all three are set.
    out.sasl = {
      mechanism: env.KAFKA_SASL_MECHANISM!,
      username: env.KAFKA_SASL_USERNAME!,
      password: env.KAFKA_SASL_PASSWORD!,
    };
  }
  return out;
}

/**
 * The connection options of @platformatic/kafka 2.12.1 for `security`.
 * The password is handed over as a function, not a string: the library's
 * options are then never a place it can be copied from (an error, a
 * diagnostic event). The broker's name is verified by node:tls's own
 * check against the host a connection was opened to (certificate SANs,
 * DNS names and IP addresses); nothing here turns that off.
 */
export function libraryTlsSasl(security: KafkaSecurity | undefined) {
  const out: {
    tls?: { ca?: string; cert?: string; key?: string };
    sasl?: { mechanism: SaslMechanism; username: string; password: () => string };
  } = {};
  if (security?.tls) {
    const { ca, cert, key } = security.tls;
    out.tls = {
      ...(ca === undefined ? {} : { ca }),
      ...(cert === undefined ? {} : { cert }),
      ...(key === undefined ? {} : { key }),
    };
  }
  if (security?.sasl) {
    const { mechanism, username, password } = security.sasl;
    out.sasl = { mechanism, username, password: () => password };
  }
  return out;
}
