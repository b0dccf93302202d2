/**
 * Kafka topic names of poimen, kept apart from the Kafka client so code that
 * only needs a name (the API, publishers, tests) does not load the client.
 *
 * Per tenant: `poimen.<tenant>.events` (outbound), `poimen.<tenant>.dispatch`
 * and `poimen.<tenant>.signals` (inbound) and `poimen.<tenant>.dispatch.dlq`
 * (dead letters of both inbound topics). Tenant ids never contain a dot, so
 * the tenant is always the second dot-separated part.
 */

/**
 * What a tenant id may look like: legal in a topic name, no dots. The one
 * definition; the patterns below are built from it. The `tenants` table's
 * check constraint (migrations/001) spells the same pattern in SQL, and
 * tests/contracts_test.ts holds the two together.
 */
const TENANT_ID = "[a-z0-9_-]{1,63}";

/** Matches a whole tenant id. */
export const TENANT_ID_PATTERN: RegExp = new RegExp(`^${TENANT_ID}$`);

const PREFIX = "poimen.";

/** True when `tenant` is a valid tenant id. */
export function isTenantId(tenant: string): boolean {
  return TENANT_ID_PATTERN.test(tenant);
}

function checked(tenant: string): string {
  // A bad id would silently produce a topic no consumer subscribes to, or
  // one that parses back as a different tenant; refuse it loudly instead.
  if (!isTenantId(tenant)) throw new TypeError(`invalid tenant id: ${JSON.stringify(tenant)}`);
  return tenant;
}

/** `poimen.<tenant>.events`: the run events the outbox publisher publishes. */
export function eventsTopic(tenant: string): string {
  return `${PREFIX}${checked(tenant)}.events`;
}

/** `poimen.<tenant>.dispatch`: run requests the inbox relay admits. */
export function dispatchTopic(tenant: string): string {
  return `${PREFIX}${checked(tenant)}.dispatch`;
}

/**
 * `poimen.<tenant>.dispatch.dlq`: dispatch and signal messages the relay gave
 * up on (a dead letter's `poimen-dlq-topic` header says which).
 */
export function dlqTopic(tenant: string): string {
  return `${PREFIX}${checked(tenant)}.dispatch.dlq`;
}

/** `poimen.<tenant>.signals`: signals for runs the inbox relay sends (`POST /v1/runs/{id}/signals`). */
export function signalsTopic(tenant: string): string {
  return `${PREFIX}${checked(tenant)}.signals`;
}

/** The four topics of a tenant, in declaration order. */
export function tenantTopics(
  tenant: string,
): [events: string, dispatch: string, dlq: string, signals: string] {
  return [eventsTopic(tenant), dispatchTopic(tenant), dlqTopic(tenant), signalsTopic(tenant)];
}

/** Matches every tenant's dispatch topic (and nothing else, not the DLQs). */
export const DISPATCH_TOPIC_PATTERN: RegExp = new RegExp(`^poimen\\.(${TENANT_ID})\\.dispatch$`);

/** Matches every tenant's signals topic. */
export const SIGNALS_TOPIC_PATTERN: RegExp = new RegExp(`^poimen\\.(${TENANT_ID})\\.signals$`);

const TENANT_TOPIC = new RegExp(
  `^poimen\\.(${TENANT_ID})\\.(?:events|dispatch|dispatch\\.dlq|signals)$`,
);

/** The tenant a poimen topic belongs to, or `undefined` for any other topic. */
export function tenantOfTopic(topic: string): string | undefined {
  return TENANT_TOPIC.exec(topic)?.[1];
}

/**
 * Key of a dispatch message: `<tenant>/<dispatch_key>`, the identity of the
 * intended run, so every redelivery of one spawn lands on one partition. A
 * message without a dispatch key gets a random one (no ordering to keep).
 */
export function dispatchMessageKey(tenant: string, dispatchKey?: string | null): string {
  return `${checked(tenant)}/${dispatchKey ?? crypto.randomUUID()}`;
}

/** Key of an event message: `<tenant>/<run_id>`, so a run's events stay in order on one partition. */
export function eventMessageKey(tenant: string, runId: string): string {
  return `${checked(tenant)}/${runId}`;
}

/**
 * Key of a signal message: `<tenant>/<run_id>`, so a run's signals stay in
 * order on one partition.
 */
export function signalMessageKey(tenant: string, runId: string): string {
  return `${checked(tenant)}/${runId}`;
}
