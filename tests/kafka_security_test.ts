/**
 * The Kafka security settings without a broker: which combinations of the
 * KAFKA_SECURITY_PROTOCOL … variables are refused (one line naming the
 * variable), how the PEM files are read, what the library is handed, how a
 * certificate failure is reported. tests/it_kafka_security_test.ts runs them
 * against a secured broker.
 */
import assert from "node:assert/strict";
import { readEnv } from "../core/config.ts";
import { ConfigError } from "../core/errors.ts";
import { createLogger } from "../core/log.ts";
import { KafkaCliEnv } from "../cli/kafka_config.ts";
import { baseOptions, kafkaFailure } from "../kafka/client.ts";
import { kafkaConnection, securityFromEnv } from "../kafka/security.ts";

const PEM_CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
const PEM_KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

function refused(env: Record<string, string>): string {
  try {
    readEnv(KafkaCliEnv, env);
  } catch (error) {
    assert.ok(error instanceof ConfigError, String(error));
    assert.ok(!error.message.includes("\n"), "one line");
    return error.message;
  }
  assert.fail(`accepted ${JSON.stringify(env)}`);
}

const SASL = {
  KAFKA_SECURITY_PROTOCOL: "SASL_SSL",
  KAFKA_SASL_MECHANISM: "SCRAM-SHA-512",
  KAFKA_SASL_USERNAME: "poimen",
  KAFKA_SASL_PASSWORD: "hunter2-secret",
};

Deno.test("kafka_security: PLAINTEXT is the default and reads no file", () => {
  const c = readEnv(KafkaCliEnv, {});
  assert.equal(c.KAFKA_SECURITY_PROTOCOL, "PLAINTEXT");
  assert.deepEqual(kafkaConnection(c), { brokers: ["127.0.0.1:9092"], security: {} });
  const options = baseOptions({ brokers: ["b:1"], clientId: "c", security: {} });
  assert.ok(!("tls" in options) && !("sasl" in options));
});

Deno.test("kafka_security: settings that cannot work together are one line naming the variable", () => {
  assert.equal(
    refused({ KAFKA_SECURITY_PROTOCOL: "TLS" }),
    'config: KAFKA_SECURITY_PROTOCOL is invalid: Invalid option: expected one of "PLAINTEXT"|"SSL"|"SASL_PLAINTEXT"|"SASL_SSL"',
  );
  assert.match(
    refused({ ...SASL, KAFKA_SASL_MECHANISM: "GSSAPI" }),
    /^config: KAFKA_SASL_MECHANISM is invalid: Invalid option: expected one of "PLAIN"\|"SCRAM-SHA-256"\|"SCRAM-SHA-512"$/,
  );
  assert.equal(
    refused({ ...SASL, KAFKA_SASL_PASSWORD: "" }),
    "config: KAFKA_SASL_PASSWORD is unset: required with KAFKA_SECURITY_PROTOCOL=SASL_SSL",
  );
  assert.equal(
    refused({ KAFKA_SECURITY_PROTOCOL: "SASL_PLAINTEXT", KAFKA_SASL_MECHANISM: "PLAIN" }),
    "config: KAFKA_SASL_USERNAME is unset: required with KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT",
  );
  assert.equal(
    refused({ KAFKA_SASL_USERNAME: "poimen" }),
    "config: KAFKA_SASL_USERNAME is invalid: only read with KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT or SASL_SSL, not PLAINTEXT",
  );
  assert.equal(
    refused({ KAFKA_SECURITY_PROTOCOL: "SASL_PLAINTEXT", ...pick(SASL), KAFKA_SSL_CA_FILE: "/ca" }),
    "config: KAFKA_SSL_CA_FILE is invalid: only read with KAFKA_SECURITY_PROTOCOL=SSL or SASL_SSL, not SASL_PLAINTEXT",
  );
  assert.equal(
    refused({ KAFKA_SECURITY_PROTOCOL: "SSL", KAFKA_SSL_CERT_FILE: "/c.pem" }),
    "config: KAFKA_SSL_KEY_FILE is unset: required with KAFKA_SSL_CERT_FILE (the certificate's key)",
  );
  assert.equal(
    refused({ KAFKA_SECURITY_PROTOCOL: "SSL", KAFKA_SSL_KEY_FILE: "/k.pem" }),
    "config: KAFKA_SSL_CERT_FILE is unset: required with KAFKA_SSL_KEY_FILE (the key's certificate)",
  );
  // The password is never part of a message about it.
  assert.ok(!refused({ ...SASL, KAFKA_SASL_USERNAME: "" }).includes("hunter2"));
});

function pick(env: typeof SASL) {
  const { KAFKA_SECURITY_PROTOCOL: _, ...rest } = env;
  return rest;
}

Deno.test("kafka_security: the PEM files are read once, checked for what they hold", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/ca.pem`, PEM_CERT);
    await Deno.writeTextFile(`${dir}/client.pem`, PEM_CERT);
    await Deno.writeTextFile(`${dir}/key.pem`, PEM_KEY);
    const env = readEnv(KafkaCliEnv, {
      ...SASL,
      KAFKA_SSL_CA_FILE: `${dir}/ca.pem`,
      KAFKA_SSL_CERT_FILE: `${dir}/client.pem`,
      KAFKA_SSL_KEY_FILE: `${dir}/key.pem`,
    });
    const security = securityFromEnv(env);
    assert.deepEqual(security, {
      tls: { ca: PEM_CERT, cert: PEM_CERT, key: PEM_KEY },
      sasl: { mechanism: "SCRAM-SHA-512", username: "poimen", password: "hunter2-secret" },
    });
    const options = baseOptions({ brokers: ["b:1"], clientId: "c", security });
    assert.deepEqual(options.tls, { ca: PEM_CERT, cert: PEM_CERT, key: PEM_KEY });
    // Handed over as a function: no copy of the options holds it as text.
    assert.equal(typeof options.sasl?.password, "function");
    assert.equal(options.sasl?.password(), "hunter2-secret");
    assert.ok(!JSON.stringify(options).includes("hunter2"));

    const bad = (vars: Record<string, string>) => {
      try {
        securityFromEnv(readEnv(KafkaCliEnv, { KAFKA_SECURITY_PROTOCOL: "SSL", ...vars }));
      } catch (error) {
        assert.ok(error instanceof ConfigError);
        return error.message;
      }
      assert.fail("accepted");
    };
    assert.match(
      bad({ KAFKA_SSL_CA_FILE: `${dir}/missing.pem` }),
      /^config: KAFKA_SSL_CA_FILE is invalid: cannot read .*missing\.pem: No such file/,
    );
    assert.equal(
      bad({ KAFKA_SSL_CA_FILE: `${dir}/key.pem` }),
      `config: KAFKA_SSL_CA_FILE is invalid: ${dir}/key.pem holds no PEM certificates`,
    );
    assert.equal(
      bad({ KAFKA_SSL_CERT_FILE: `${dir}/client.pem`, KAFKA_SSL_KEY_FILE: `${dir}/ca.pem` }),
      `config: KAFKA_SSL_KEY_FILE is invalid: ${dir}/ca.pem holds no unencrypted PEM private key`,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("kafka_security: an untrusted certificate is reported with what to check", () => {
  const tls = Object.assign(new Error("self-signed certificate in certificate chain"), {
    code: "SELF_SIGNED_CERT_IN_CHAIN",
  });
  const wrapped = new Error("Connection to 127.0.0.1:9094 failed.", { cause: tls });
  assert.equal(
    kafkaFailure("kafka admin listTopics", wrapped).message,
    "kafka admin listTopics: self-signed certificate in certificate chain " +
      "(the broker's TLS certificate is not trusted: is KAFKA_SSL_CA_FILE, or DENO_CERT, its CA?)",
  );
  const name = Object.assign(new Error("Hostname/IP does not match"), {
    code: "ERR_TLS_CERT_ALTNAME_INVALID",
  });
  assert.match(kafkaFailure("x", name).message, /does not name the host of KAFKA_BROKERS\)$/);
  assert.equal(
    kafkaFailure("x", new Error("connect ECONNREFUSED")).message,
    "x: connect ECONNREFUSED",
  );
});

Deno.test("kafka_security: the logger writes no password of a config or an error", () => {
  const lines: string[] = [];
  const log = createLogger("t", "info", (l) => lines.push(l));
  const security = securityFromEnv(
    readEnv(KafkaCliEnv, { ...SASL, KAFKA_SECURITY_PROTOCOL: "SASL_PLAINTEXT" }),
  );
  log.info("config", { security, KAFKA_SASL_PASSWORD: "hunter2-secret" });
  assert.equal(lines.length, 1);
  assert.ok(!lines[0].includes("hunter2"), lines[0]);
});
