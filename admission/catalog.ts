/**
 * What admission knows of workflows: each registered version's input schema
 * compiled once (ajv, JSON Schema 2020-12) and its max attempts, looked up by
 * `name` (the workflow's current version, migration 018) or `name@version`.
 * The API loads no workflow code: `WorkflowCatalog` reads the catalog the
 * workers register in (db/catalog.ts) and learns new versions and promotions
 * without a restart — a NOTIFY after each registration or promotion, a
 * refresh on a timer as the fallback, and a refresh before a workflow is
 * called unknown, so a version registered a moment ago is never refused for
 * being new. A version registered for some tenants only (`tenants` in its
 * definition) does not exist for any other tenant: it resolves for them as an
 * unknown workflow would, and is not listed to them; a bare name gets such a
 * tenant the newest version up to the current one that it may start.
 */
import { Ajv2020, type ErrorObject, type ValidateFunction } from "ajv/dist/2020.js";
import type { FieldError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Service } from "../core/lifecycle.ts";
import { once } from "../core/lifecycle.ts";
import { SECOND } from "../core/time.ts";
import { formatPath } from "../contracts/json_value.ts";
import { WORKFLOW_REF_PATTERN } from "../contracts/runs.ts";
import { parseTenantScope, type TenantScope } from "../contracts/tenant_scope.ts";
import { type CatalogEntry, type CatalogVersion, selectCatalog } from "../db/catalog.ts";
import { Listener } from "../db/listener.ts";
import { CATALOG_CHANNEL } from "../db/notify.ts";
import type { Sql } from "../db/pool.ts";

/** A problem body lists at most this many failing fields. */
const MAX_REPORTED = 20;

/** One version as admission uses it. */
export interface AdmissionVersion {
  name: string;
  version: number;
  /** null: the API's default. */
  maxAttempts: number | null;
  /** Its concurrency limit (workflows/concurrency.ts); null: not limited. */
  concurrency: { limit: number; key: string | null } | null;
  /** Its debounce in milliseconds (contracts/debounce.ts); null: not debounced. */
  debounce: { key: string | null; period: number; maxWait: number } | null;
  /** The tenants that may start it; null: every tenant. */
  tenants: TenantScope | null;
  /** The input's failing fields (paths under `input`), or undefined when it is valid. */
  validate(input: unknown): FieldError[] | undefined;
  /**
   * Signal `name`'s payload's failing fields (paths under `payload`) against
   * the schema the version declares for it (migration 023); undefined when
   * it is valid or the version declares no signal of that name.
   */
  validateSignal(name: string, payload: unknown): FieldError[] | undefined;
}

/** How admission finds a workflow version. */
export interface WorkflowLookup {
  /**
   * `name` (its current version, or when `tenant` may not start that one the
   * newest older version it may) or `name@version`; undefined when unknown
   * here or not for `tenant`.
   */
  resolve(ref: string, tenant: string): AdmissionVersion | undefined;
  /**
   * Called before a ref is answered as unknown: looks again where the
   * versions come from (bounded by the implementation), resolving once done.
   */
  refreshUnknown(): Promise<void>;
  /** Every known `name@version` that `tenant` may start, sorted, for error messages. */
  list(tenant: string): string[];
}

// One ajv for the process: compiled validators share its caches. Formats are
// not validated by name (zod's JSON Schema carries a `pattern` beside each
// `format` it knows); strict off because zod emits keywords ajv's strict
// mode calls unknown (e.g. `$schema` in nested places).
const ajv = new Ajv2020({ allErrors: true, strict: false, validateFormats: false, verbose: true });

/** Compiles one catalog version (throws when its schema is not valid JSON Schema). */
export function compileVersion(v: CatalogVersion): AdmissionVersion {
  const check: ValidateFunction = ajv.compile(v.input_schema);
  const signals = new Map(
    Object.entries(v.signal_schemas ?? {}).map(([name, schema]) => [name, ajv.compile(schema)]),
  );
  let tenants: TenantScope | null = null;
  if (v.tenants != null) {
    const parsed = parseTenantScope(v.tenants);
    if (parsed.problem !== undefined) throw new TypeError(`tenants: ${parsed.problem}`);
    tenants = parsed.scope.all ? null : parsed.scope;
  }
  return {
    name: v.name,
    version: v.version,
    maxAttempts: v.max_attempts,
    concurrency: v.concurrency_limit == null
      ? null
      : { limit: v.concurrency_limit, key: v.concurrency_key ?? null },
    debounce: v.debounce == null
      ? null
      : { key: v.debounce.key ?? null, period: v.debounce.period, maxWait: v.debounce.maxWait },
    tenants,
    validate(input) {
      if (check(input)) return undefined;
      return (check.errors ?? []).slice(0, MAX_REPORTED).map((e) => fieldError(e, "input"));
    },
    validateSignal(name, payload) {
      const checkSignal = signals.get(name);
      if (checkSignal === undefined || checkSignal(payload)) return undefined;
      return (checkSignal.errors ?? []).slice(0, MAX_REPORTED).map((e) => fieldError(e, "payload"));
    },
  };
}

/** A failing field as problem+json reports it: `<root>.<path>`, ajv's message. */
function fieldError(e: ErrorObject, root: "input" | "payload"): FieldError {
  const path: (string | number)[] = [root];
  for (const segment of e.instancePath.split("/").slice(1)) {
    const key = segment.replaceAll("~1", "/").replaceAll("~0", "~");
    path.push(/^(0|[1-9][0-9]*)$/.test(key) ? Number(key) : key);
  }
  const params = e.params as Record<string, unknown>;
  if (e.keyword === "required") path.push(String(params.missingProperty));
  if (e.keyword === "additionalProperties") path.push(String(params.additionalProperty));
  const format = (e.parentSchema as { format?: unknown } | undefined)?.format;
  const message = e.keyword === "required"
    ? "is required"
    : e.keyword === "additionalProperties"
    ? "is not allowed"
    : e.keyword === "pattern"
    ? (typeof format === "string" ? `must be a valid ${format}` : "does not match the pattern")
    : e.message ?? e.keyword;
  return { path: formatPath(path), message };
}

/** Whether `tenant` may start `v`. */
function allowed(v: AdmissionVersion, tenant: string): boolean {
  return v.tenants === null || v.tenants.allows(tenant);
}

/**
 * The version a run naming only the workflow gets: the current one (a
 * ceiling), or the newest older one `allowed` when the current one is not.
 * `versions` newest first.
 */
export function bareNameVersion<V extends { version: number }>(
  versions: readonly V[],
  current: number,
  allowed: (v: V) => boolean,
): V | undefined {
  return versions.find((v) => v.version <= current && allowed(v));
}

/** Versions by name, newest first, and each name's current version, with lookups by ref and tenant. */
class VersionIndex {
  readonly #byRef = new Map<string, AdmissionVersion>();
  // name → its versions, newest first (a name has a few).
  readonly #byName = new Map<string, AdmissionVersion[]>();
  // name → its current version (migration 018); a name not here: its newest.
  readonly #current = new Map<string, number>();

  has(name: string, version: number): boolean {
    return this.#byRef.has(`${name}@${version}`);
  }

  add(v: AdmissionVersion): void {
    this.#byRef.set(`${v.name}@${v.version}`, v);
    const versions = this.#byName.get(v.name) ?? [];
    versions.push(v);
    versions.sort((a, b) => b.version - a.version);
    this.#byName.set(v.name, versions);
  }

  /** Sets `name`'s current version; returns the one it replaces (undefined: none). */
  setCurrent(name: string, version: number): number | undefined {
    const before = this.#current.get(name);
    this.#current.set(name, version);
    return before;
  }

  resolve(ref: string, tenant: string): AdmissionVersion | undefined {
    const exact = this.#byRef.get(ref);
    if (exact) return allowed(exact, tenant) ? exact : undefined;
    const m = WORKFLOW_REF_PATTERN.exec(ref);
    if (!m || m[2] !== undefined) return undefined;
    const versions = this.#byName.get(m[1]);
    if (!versions) return undefined;
    const current = this.#current.get(m[1]) ?? versions[0].version;
    // A current version that did not compile is refused, not stepped over to an older one.
    if (!this.#byRef.has(`${m[1]}@${current}`)) return undefined;
    return bareNameVersion(versions, current, (v) => allowed(v, tenant));
  }

  list(tenant: string): string[] {
    return [...this.#byRef.entries()].filter(([, v]) => allowed(v, tenant)).map(([ref]) => ref)
      .sort();
  }
}

/**
 * A fixed set of versions (tests, the bench, a single process): nothing to
 * refresh. A version marked `current` is its name's current version; a name
 * with none marked has no registration order to go by, so its newest is.
 */
export class StaticCatalog implements WorkflowLookup {
  readonly #index = new VersionIndex();

  constructor(versions: Iterable<CatalogVersion & { current?: boolean }>) {
    for (const v of versions) {
      this.#index.add(compileVersion(v));
      if (v.current) this.#index.setCurrent(v.name, v.version);
    }
  }

  resolve(ref: string, tenant: string): AdmissionVersion | undefined {
    return this.#index.resolve(ref, tenant);
  }

  refreshUnknown(): Promise<void> {
    return Promise.resolve();
  }

  list(tenant: string): string[] {
    return this.#index.list(tenant);
  }
}

/** Options of `WorkflowCatalog`. */
export interface WorkflowCatalogOptions {
  /** The fallback refresh's interval (a NOTIFY normally comes first). */
  refreshMs: number;
  /** Opens the one-connection pool the catalog LISTENs on (see db/listener.ts). */
  listen: () => Sql;
  log: Logger;
  /** An unknown workflow refreshes at most this often (a flood of bad names costs one read a second). */
  missRefreshMs?: number;
}

/** The catalog in Postgres, kept in memory; see the module comment. */
export class WorkflowCatalog implements WorkflowLookup, Service {
  readonly #sql: Sql;
  readonly #opts: WorkflowCatalogOptions;
  readonly #index = new VersionIndex();
  readonly #listener: Listener;
  #timer: ReturnType<typeof setInterval> | undefined;
  #inFlight: Promise<void> | undefined;
  #again = false;
  #lastStarted = -Infinity;

  constructor(sql: Sql, opts: WorkflowCatalogOptions) {
    this.#sql = sql;
    this.#opts = opts;
    this.#listener = new Listener({
      connect: opts.listen,
      channels: { [CATALOG_CHANNEL]: () => void this.refresh() },
      // A reconnect may have missed registrations.
      onListen: () => void this.refresh(),
      log: opts.log,
    });
  }

  /** Loads the catalog (when Postgres answers; otherwise the timer tries again) and listens. */
  async start(): Promise<void> {
    await this.#listener.start();
    await this.refresh();
    this.#timer = setInterval(() => void this.refresh(), this.#opts.refreshMs);
  }

  /** Stops listening and refreshing; safe to call twice. */
  stop: () => Promise<void> = once(async () => {
    clearInterval(this.#timer);
    await this.#listener.stop();
    await this.#inFlight;
  });

  resolve(ref: string, tenant: string): AdmissionVersion | undefined {
    return this.#index.resolve(ref, tenant);
  }

  list(tenant: string): string[] {
    return this.#index.list(tenant);
  }

  /**
   * Reads the catalog, compiles the versions not seen yet (a version is
   * immutable, so one seen is never read twice) and takes each name's
   * current version. Refreshes asked for while one runs share the next one,
   * which starts when it ends: one read at a time, and none missed.
   */
  refresh(): Promise<void> {
    if (this.#inFlight) {
      this.#again = true;
      return this.#inFlight;
    }
    this.#lastStarted = performance.now();
    const run = async () => {
      do {
        this.#again = false;
        await this.#load();
      } while (this.#again);
    };
    this.#inFlight = run().finally(() => this.#inFlight = undefined);
    return this.#inFlight;
  }

  /** A refresh for an unknown workflow: shared with one in flight, at most one a `missRefreshMs`. */
  refreshUnknown(): Promise<void> {
    if (this.#inFlight) return this.#inFlight;
    const since = performance.now() - this.#lastStarted;
    if (since < (this.#opts.missRefreshMs ?? SECOND)) return Promise.resolve();
    return this.refresh();
  }

  async #load(): Promise<void> {
    let rows: CatalogEntry[];
    try {
      rows = await selectCatalog(this.#sql);
    } catch (err) {
      this.#opts.log.warn("catalog refresh failed", { error: err });
      return;
    }
    for (const row of rows) {
      if (this.#index.has(row.name, row.version)) continue;
      try {
        this.#index.add(compileVersion(row));
        this.#opts.log.info("workflow version learned", {
          workflow: `${row.name}@${row.version}`,
        });
      } catch (err) {
        // Registered by a worker whose schema ajv cannot compile: runs of it
        // are refused as unknown; say why once per refresh.
        this.#opts.log.error("workflow version not compiled", {
          workflow: `${row.name}@${row.version}`,
          error: err,
        });
      }
    }
    // After the versions: a promotion is read with the version it names.
    for (const row of rows.filter((r) => r.current)) {
      const before = this.#index.setCurrent(row.name, row.version);
      if (before !== row.version) {
        this.#opts.log.info("workflow current version learned", {
          workflow: `${row.name}@${row.version}`,
          previous: before === undefined ? null : `${row.name}@${before}`,
        });
      }
    }
  }
}
