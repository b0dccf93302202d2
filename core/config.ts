/**
 * Reading configuration: each process declares a zod object of the
 * environment variables it uses, reads it once at start-up with `readEnv`,
 * and passes the typed result in. A bad or missing value becomes a
 * `ConfigError` whose message is one line naming the variable; `main.ts`
 * prints it and exits with code 2.
 */
import { z } from "zod";
import { ConfigError } from "./errors.ts";
import { DAY } from "./time.ts";

/** Parses `env` with `schema`; throws a one-line `ConfigError` naming the first bad variable. */
export function readEnv<S extends z.ZodObject>(
  schema: S,
  env: Record<string, string | undefined>,
): z.infer<S> {
  const picked: Record<string, string | undefined> = {};
  for (const key of Object.keys(schema.shape)) {
    // An empty variable is treated as unset, as shells and compose files produce them.
    picked[key] = env[key] === "" ? undefined : env[key];
  }
  const result = schema.safeParse(picked);
  if (result.success) {
    // Settings that only work together (SASL_SSL and its credentials, a certificate and its key).
    if ("KAFKA_SECURITY_PROTOCOL" in schema.shape) {
      const problem = securityEnvProblem(result.data as KafkaSecurityEnv);
      if (problem) {
        const [name, message] = problem;
        const shown = picked[name] === undefined ? "unset" : "invalid";
        throw new ConfigError(`config: ${name} is ${shown}: ${message}`);
      }
    }
    return result.data;
  }
  const issue = result.error.issues[0];
  const name = String(issue.path[0] ?? "environment");
  const shown = picked[name] === undefined ? "unset" : "invalid";
  throw new ConfigError(`config: ${name} is ${shown}: ${issue.message}`);
}

/** The environment of this process, as a plain record (needs --allow-env). */
export function processEnv(): Record<string, string | undefined> {
  return Deno.env.toObject();
}

// Field builders shared by the processes' schemas.

/** A TCP port. */
export const port = (fallback: number) =>
  z.coerce.number().int().min(0).max(65535).default(fallback);
/** A positive integer. */
export const positiveInt = (fallback: number) =>
  z.coerce.number().int().positive().default(fallback);
/** A duration in milliseconds. */
export const millis = (fallback: number) => z.coerce.number().int().nonnegative().default(fallback);

/**
 * Where each process serves `/metrics`, `/healthz` and `/readyz` for
 * operators unless told otherwise (the API's listener is the one with its
 * per-tenant series; its own PORT serves only tenant-free ones): one port
 * each, so the four run side by side on one host. 0 picks a free port (logged).
 */
export const DEFAULT_METRICS_PORTS = {
  api: 9464,
  relay: 9465,
  worker: 9466,
  outbox: 9467,
} as const;

export const DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/poimen";
export const DEFAULT_KAFKA_BROKERS = "127.0.0.1:9092";

/** Variables every process that talks to Postgres reads. */
/**
 * The `sslmode`s the driver understands (libpq's names): `disable`, `allow`,
 * `prefer` and `require` encrypt without verifying; `verify-ca` and
 * `verify-full` verify the server's certificate against the trusted CAs and
 * its name against the URL's host (verify-ca is as strict as verify-full
 * here). The CA of a private server is given with Deno's own `DENO_CERT`.
 */
const SSL_MODES = ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"];

/** Why a `DATABASE_URL`'s TLS settings cannot work as written, or undefined. */
function databaseUrlProblem(url: string): string | undefined {
  // Not a URL at all is .url()'s to report (zod runs the refinement anyway).
  if (!URL.canParse(url)) return undefined;
  const params = new URL(url).searchParams;
  const mode = params.get("sslmode");
  if (mode !== null && !SSL_MODES.includes(mode)) {
    return `sslmode=${mode} is not one of ${SSL_MODES.join(", ")}`;
  }
  const root = params.get("sslrootcert");
  if (root !== null && root !== "system") {
    return "sslrootcert is not read from a file here: give the CA with DENO_CERT=<file> and sslmode=verify-full (or sslrootcert=system for the system's CAs)";
  }
  return undefined;
}

export const databaseEnv = {
  DATABASE_URL: z.string().url().default(DEFAULT_DATABASE_URL).superRefine((url, ctx) => {
    const problem = databaseUrlProblem(url);
    if (problem) ctx.addIssue({ code: "custom", message: problem });
  }),
  DATABASE_POOL_SIZE: positiveInt(10),
};

/** The SASL mechanisms `KAFKA_SASL_MECHANISM` takes (Kafka's names). */
export const SASL_MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] as const;

/** Kafka's `security.protocol` values, as `KAFKA_SECURITY_PROTOCOL` takes them. */
const SECURITY_PROTOCOLS = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] as const;

/**
 * The security variables of `kafkaEnv`, as validated there; kafka/security.ts
 * `securityFromEnv` turns them into a client's settings.
 */
export interface KafkaSecurityEnv {
  KAFKA_SECURITY_PROTOCOL: typeof SECURITY_PROTOCOLS[number];
  KAFKA_SASL_MECHANISM?: typeof SASL_MECHANISMS[number];
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

/** Variables every process that talks to Kafka reads. */
export const kafkaEnv = {
  KAFKA_BROKERS: z.string().regex(/^[^,\s]+:\d+(,[^,\s]+:\d+)*$/, "expected host:port[,host:port…]")
    .default(DEFAULT_KAFKA_BROKERS),
  KAFKA_CLIENT_ID: z.string().min(1).default("poimen"),
  TOPIC_PARTITIONS: positiveInt(3),
  TOPIC_REPLICATION_FACTOR: positiveInt(1),
  TOPIC_RETENTION_MS: millis(7 * DAY),
  /**
   * `max.message.bytes` of the events and dispatch topics, set when they are
   * declared; the outbox parks an event larger than this instead of sending it.
   */
  EVENTS_MAX_MESSAGE_BYTES: z.coerce.number().int().min(1024).default(1024 * 1024),
  /**
   * Kafka's `security.protocol`: TLS (`SSL`), SASL (`SASL_PLAINTEXT`), both
   * (`SASL_SSL`) or neither. The settings below only work together (checked
   * by `readEnv`); kafka/security.ts `kafkaConnection` reads the files.
   */
  KAFKA_SECURITY_PROTOCOL: z.enum(SECURITY_PROTOCOLS).default("PLAINTEXT"),
  KAFKA_SASL_MECHANISM: z.enum(SASL_MECHANISMS).optional(),
  KAFKA_SASL_USERNAME: z.string().min(1).optional(),
  /** Never logged: the logger redacts `password` keys, the library gets it as a function. */
  KAFKA_SASL_PASSWORD: z.string().min(1).optional(),
  /** PEM CA certificates the broker's must chain to (default: the trusted CAs, DENO_CERT's too). */
  KAFKA_SSL_CA_FILE: z.string().min(1).optional(),
  /** A PEM client certificate, for a broker that asks for one; with KAFKA_SSL_KEY_FILE. */
  KAFKA_SSL_CERT_FILE: z.string().min(1).optional(),
  /** Its unencrypted PEM private key. */
  KAFKA_SSL_KEY_FILE: z.string().min(1).optional(),
};

export const logEnv = {
  LOG_LEVEL: z.enum(["debug", "info", "warn", "error"]).default("info"),
};
