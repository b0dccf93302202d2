/** Reading request bodies and parameters into validated values, or typed errors. */
import type { Context, MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { z } from "zod";
import { PoimenError } from "../core/errors.ts";

/**
 * Refuses a body that is not JSON by its content type (415). Runs before
 * the size limit, so a large body of the wrong type is told its type.
 */
export const requireJson: MiddlewareHandler = async (c, next) => {
  const type = c.req.header("content-type") ?? "";
  if (!/^application\/([a-z0-9.+-]+\+)?json\s*(;|$)/i.test(type)) {
    throw new PoimenError(
      "unsupported-media-type",
      `content type ${JSON.stringify(type)} is not JSON`,
    );
  }
  await next();
};

/**
 * hono's `bodyLimit`, refusing with our 413 problem: by Content-Length when
 * there is one, otherwise while it reads the streamed body (it stops at the
 * limit and never buffers more).
 */
export function limitBody(maxSize: number): MiddlewareHandler {
  return bodyLimit({
    maxSize,
    onError: () => {
      throw new PoimenError("body-too-large", `the body exceeds ${maxSize} bytes`);
    },
  });
}

/** Reads the (already size-limited) body as JSON: 400 when empty, not UTF-8 or not JSON. */
export async function parseJsonBody(c: Context): Promise<unknown> {
  const bytes = new Uint8Array(await c.req.arrayBuffer());
  if (bytes.byteLength === 0) throw new PoimenError("bad-json", "the body is empty");
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new PoimenError("bad-json", "the body is not UTF-8");
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new PoimenError("bad-json", `the body is not JSON: ${(err as Error).message}`);
  }
}

/** Validates `value` with `schema`; a mismatch is a 422 listing every failing field. */
export function parseWith<S extends z.ZodType>(schema: S, value: unknown): z.infer<S> {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  throw new PoimenError("validation", "the request does not match the schema", {
    errors: r.error.issues.map((i) => ({
      path: i.path.map(String).join(".") || "(body)",
      message: i.message,
    })),
  });
}
