/**
 * How a Kafka client proves who it is and whom it talks to: TLS (the
 * broker's certificate verified against the trusted CAs and its name against
 * the host it was reached by; optionally a client certificate) and SASL
 * (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`), as `KafkaSecurity`, and the
 * options of @platformatic/kafka 2.12.1 it becomes.
 *
 * `securityFromEnv` (and `kafkaConnection`, with the brokers) reads it from
 * the `KAFKA_SECURITY_PROTOCOL` … variables, validated by core/config.ts
 * (`kafkaEnv`, `readEnv`), once at start-up: the PEM files named there are
 * read then (a missing or unreadable one is a `ConfigError` naming its
 * variable), so the process never reads a file afterwards.
 */
import { ConfigError } from "../core/errors.ts";
import type { KafkaSecurityEnv } from "../core/config.ts";

/** A SASL mechanism poimen speaks (Kafka's names; `SASL_MECHANISMS` of core/config.ts). */
export type SaslMechanism = "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512";

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

/** Splits `KAFKA_BROKERS` into a list. */
export function brokerList(brokers: string): string[] {
  return brokers.split(",").map((b) => b.trim()).filter(Boolean);
}

/**
 * Where and how to reach Kafka from validated `kafkaEnv` variables: the
 * brokers and the security settings, reading the PEM files named (a
 * `ConfigError` naming the variable when one cannot be read). Call once at
 * start-up.
 */
export function kafkaConnection(
  env: { KAFKA_BROKERS: string } & KafkaSecurityEnv,
): { brokers: string[]; security: KafkaSecurity } {
  return { brokers: brokerList(env.KAFKA_BROKERS), security: securityFromEnv(env) };
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
