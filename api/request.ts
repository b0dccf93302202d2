/** Reading request bodies and parameters into validated values, or typed errors. */
import type { Context, MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { z } from "zod";
import { type FieldError, PoimenError } from "../core/errors.ts";
import { formatPath } from "../contracts/json_value.ts";
import type { BodyBudget } from "./body_budget.ts";
import type { Principal } from "./auth.ts";

/**
 * Refuses a body that is not JSON by its content type (415): the type must be
 * `application/json` or `application/<x>+json`, and a `charset`, if any,
 * UTF-8 (JSON has no other encoding, RFC 8259). Runs before the size limit,
 * so a large body of the wrong type is told its type.
 */
export const requireJson: MiddlewareHandler = async (c, next) => {
  const type = c.req.header("content-type") ?? "";
  const m = /^\s*application\/(?:[a-z0-9.+-]+\+)?json\s*(;.*)?$/is.exec(type);
  const charset = /;\s*charset\s*=\s*"?([^";\s]*)"?/i.exec(m?.[1] ?? "")?.[1];
  if (!m || (charset !== undefined && !/^utf-?8$/i.test(charset))) {
    throw new PoimenError(
      "unsupported-media-type",
      `content type ${JSON.stringify(type)} is not JSON in UTF-8`,
    );
  }
  await next();
};

/**
 * hono's `bodyLimit`, refusing with our 413 problem: by Content-Length when
 * there is one, otherwise while it reads the streamed body (it stops at the
 * limit and never buffers more). With a `budget`, the request first takes
 * its Content-Length (or, streamed, the whole limit) from it, charged to its
 * tenant's share (a service token's to none), and holds it until its
 * response is ready; one that cannot get it within `budget.waitMs` is
 * refused with a retryable 503 (`busy`).
 */
export function limitBody(
  maxSize: number,
  budget?: { bytes: BodyBudget; waitMs: number },
): MiddlewareHandler {
  const limit = bodyLimit({
    maxSize,
    onError: () => {
      throw new PoimenError("body-too-large", `the body exceeds ${maxSize} bytes`);
    },
  });
  const limited: MiddlewareHandler = async (c, next) => {
    // Without a Content-Length, bodyLimit reads the stream itself: a stream
    // that breaks off fails there, before any handler, and is the client's
    // doing (400, worth resending), not a 500. Errors after next() are the
    // handler's and pass through untouched.
    let downstream = false;
    try {
      await limit(c, () => {
        downstream = true;
        return next();
      });
    } catch (err) {
      if (downstream || err instanceof PoimenError) throw err;
      throw unreadable(err);
    }
  };
  if (!budget) return limited;
  return async (c, next) => {
    const declared = Number(c.req.header("content-length") ?? NaN);
    // Over the limit by its own account: refused at once, nothing to hold.
    if (declared > maxSize) return await limited(c, next);
    const bytes = Number.isInteger(declared) && declared >= 0 ? declared : maxSize;
    // Charged to the tenant's share; a service token's (the relay's) to none.
    // /v1's authentication has run: the caller is known before any byte is read.
    const principal = c.get("principal") as Principal | undefined;
    const tenant = principal?.kind === "service" ? undefined : principal?.tenantId ?? "";
    // The common case takes its share without a promise or a timer.
    const release = budget.bytes.tryAcquire(bytes, tenant) ??
      await budget.bytes.acquire(bytes, budget.waitMs, tenant, c.req.raw.signal);
    // A handler that has parsed the body and then waits gives it back early.
    c.set("releaseBody", release);
    try {
      await limited(c, next);
    } finally {
      release();
    }
  };
}

function unreadable(cause: unknown): PoimenError {
  return new PoimenError("body-unreadable", "the request body ended before it was complete", {
    cause,
  });
}

/**
 * Deadlines of body reads in progress, checked by one timer every
 * `SLOW_READ_CHECK_MS` while any is watched: a timer per request costs
 * measurably on the admission path (Deno timers are not free), a late 408 by
 * up to a second does not.
 */
const SLOW_READ_CHECK_MS = 1000;
const slowReads = {
  reads: new Map<object, { deadline: number; expire: () => void }>(),
  timer: undefined as ReturnType<typeof setInterval> | undefined,
  /** Calls `expire` once `deadline` (epoch ms) has passed, unless the returned function is called first. */
  watch(deadline: number, expire: () => void): () => void {
    const key = {};
    this.reads.set(key, { deadline, expire });
    if (this.timer === undefined) {
      this.timer = setInterval(() => this.check(), SLOW_READ_CHECK_MS);
      // Never what keeps a process alive.
      Deno.unrefTimer(this.timer);
    }
    // The timer stops at its next check with nothing watched, not here: a
    // run of one-at-a-time requests must not create one each.
    return () => this.reads.delete(key);
  },
  check(): void {
    const now = Date.now();
    for (const [key, r] of this.reads) {
      if (r.deadline > now) continue;
      this.reads.delete(key);
      r.expire();
    }
    if (this.reads.size === 0 && this.timer !== undefined) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  },
};

// One decoder for every request: decode() without `stream` keeps no state between calls.
const UTF8 = new TextDecoder("utf-8", { fatal: true });

/**
 * Reads the (already size-limited) body as JSON: 400 when empty, not UTF-8 or
 * not JSON; 408 when it has not all arrived within `readTimeoutMs`.
 */
export async function parseJsonBody(c: Context, readTimeoutMs?: number): Promise<unknown> {
  let bytes: Uint8Array;
  let stopWatching = () => {};
  try {
    const read = c.req.arrayBuffer();
    let late: Promise<never> | undefined;
    if (readTimeoutMs !== undefined) {
      late = new Promise<never>((_, reject) => {
        stopWatching = slowReads.watch(Date.now() + readTimeoutMs, () => {
          // The read goes on until the client ends or drops it; its result is ignored.
          read.catch(() => {});
          reject(
            new PoimenError("body-timeout", `the body did not arrive within ${readTimeoutMs} ms`),
          );
        });
      });
    }
    bytes = new Uint8Array(await (late ? Promise.race([read, late]) : read));
  } catch (err) {
    // bodyLimit's 413 surfaces here while the body streams in; anything else
    // is the stream breaking under us, which is the client's, not a 500.
    if (err instanceof PoimenError) throw err;
    throw unreadable(err);
  } finally {
    stopWatching();
  }
  if (bytes.byteLength === 0) throw new PoimenError("bad-json", "the body is empty");
  let text: string;
  try {
    text = UTF8.decode(bytes);
  } catch {
    throw new PoimenError("bad-json", "the body is not UTF-8");
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new PoimenError("bad-json", `the body is not JSON: ${(err as Error).message}`);
  }
}

/** Validates `value` with `schema`; a mismatch is a 422 listing the failing fields (at most 20). */
export function parseWith<S extends z.ZodType>(
  schema: S,
  value: unknown,
  root = "(body)",
): z.infer<S> {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const errors: FieldError[] = [];
  for (const i of r.error.issues) {
    // One entry per unknown field, at its own path, rather than one at the root.
    const paths = i.code === "unrecognized_keys" ? i.keys.map((k) => [...i.path, k]) : [i.path];
    for (const path of paths) {
      errors.push({
        path: formatPath(path) || root,
        message: i.code === "unrecognized_keys" ? "unknown field" : i.message,
      });
    }
  }
  throw new PoimenError("validation", "the request does not match the schema", {
    errors: errors.slice(0, 20),
  });
}

/**
 * Parses the query string itself, strictly: `+` is a space, every name and
 * value must be percent-encoded UTF-8, and a parameter given twice is
 * refused, so no filter is silently ignored. Then validates it with
 * `schema` (422 naming the parameter).
 */
export function parseQuery<S extends z.ZodType>(c: Context, schema: S): z.infer<S> {
  const url = c.req.url;
  const at = url.indexOf("?");
  const raw = at < 0 ? "" : url.slice(at + 1).replace(/#.*$/s, "");
  const params: Record<string, string> = {};
  const errors: FieldError[] = [];
  for (const part of raw.split("&")) {
    if (part === "") continue;
    const eq = part.indexOf("=");
    const name = decode(eq < 0 ? part : part.slice(0, eq));
    const value = decode(eq < 0 ? "" : part.slice(eq + 1));
    if (name === undefined) {
      errors.push({ path: "(query)", message: "a parameter name is not percent-encoded UTF-8" });
    } else if (value === undefined) {
      errors.push({ path: formatPath([name]), message: "not percent-encoded UTF-8" });
    } else if (Object.hasOwn(params, name)) {
      errors.push({ path: formatPath([name]), message: "given more than once" });
    } else params[name] = value;
  }
  if (errors.length > 0) {
    throw new PoimenError("validation", "the query string is malformed", {
      errors: errors.slice(0, 20),
    });
  }
  return parseWith(schema, params, "(query)");
}

// undefined when not valid percent-encoded UTF-8 (decodeURIComponent also
// refuses encoded lone surrogates, which are not UTF-8 either).
function decode(s: string): string | undefined {
  try {
    return decodeURIComponent(s.replaceAll("+", " "));
  } catch {
    return undefined;
  }
}
