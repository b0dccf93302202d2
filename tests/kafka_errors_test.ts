/**
 * The boundary where the Kafka library's errors become poimen's: a failed
 * produce or admin call rejects with a `PoimenError` of the one error table
 * (`kafka-unavailable`, retryable; `kafka-refused` for records the broker
 * will never take), its message naming the call and the root cause, the
 * library's error kept as the cause. Against the real broker, and a port
 * where none listens. (A produce with no broker at all is not tried: the
 * library's producer, 2.12.1, waits for one however few retries it is given,
 * which is why the outbox bounds each send by OUTBOX_SEND_TIMEOUT_MS.)
 */
import assert from "node:assert/strict";
import { PoimenError } from "../core/errors.ts";
import { createAdmin } from "../kafka/admin.ts";
import { isApiError } from "../kafka/client.ts";
import { createProducer, permanentRecordError } from "../kafka/producer.ts";
import { BROKER } from "./support/kafka.ts";
import { freePort } from "./support/processes.ts";

const nowhere = () => [`127.0.0.1:${freePort()}`];

Deno.test("kafka errors: an admin call to a broker that is not there names the call", async () => {
  const admin = createAdmin({ brokers: nowhere(), clientId: "errors-test", retries: 0 });
  try {
    const err = await admin.listTopics().catch((e) => e);
    assert.ok(err instanceof PoimenError, String(err));
    assert.equal(err.code, "kafka-unavailable");
    assert.match(err.message, /^kafka admin listTopics: /);
  } finally {
    await admin.close();
  }
});

Deno.test("kafka errors: a record the broker refuses is kafka-refused, not retryable, and still found as such", async () => {
  const topic = `errors-${crypto.randomUUID().slice(0, 8)}`;
  const admin = createAdmin({ brokers: [BROKER], clientId: "errors-test" });
  const producer = createProducer({ brokers: [BROKER], clientId: "errors-test", retries: 0 });
  try {
    await admin.createTopics([{
      name: topic,
      partitions: 1,
      replicationFactor: 1,
      configs: { "max.message.bytes": "1024" },
    }]);
    // Declaring it again: the library's TOPIC_ALREADY_EXISTS is still seen through the wrapper.
    assert.deepEqual(
      (await admin.createTopics([{ name: topic, partitions: 1, replicationFactor: 1 }])).existing,
      [topic],
    );
    const err = await producer.send([{ topic, key: "k", value: "x".repeat(4096) }]).catch((e) => e);
    assert.ok(err instanceof PoimenError, String(err));
    assert.equal(err.code, "kafka-refused");
    assert.equal(err.retryable, false);
    assert.ok(permanentRecordError(err), "the broker's code is found through the wrapper");
    assert.equal(
      isApiError(err, "MESSAGE_TOO_LARGE") || isApiError(err, "RECORD_LIST_TOO_LARGE"),
      true,
    );
  } finally {
    await producer.close();
    await admin.deleteTopics([topic]).catch(() => {});
    await admin.close();
  }
});
