/** Reading request bodies and parameters into validated values, or typed errors. */
import type { Context } from "hono";
import type { z } from "zod";
import { PoimenError } from "../core/errors.ts";

/**
 * Reads a JSON body of at most `limit` bytes: 415 unless the content type is
 * JSON, 413 when longer (by Content-Length, or while streaming a body that
 * has none), 400 when not JSON.
 */
export async function parseJsonBody(c: Context, limit: number): Promise<unknown> {
  const type = c.req.header("content-type") ?? "";
  if (!/^application\/([a-z0-9.+-]+\+)?json\s*(;|$)/i.test(type)) {
    throw new PoimenError(
      "unsupported-media-type",
      `content type ${JSON.stringify(type)} is not JSON`,
    );
  }
  const declared = Number(c.req.header("content-length") ?? NaN);
  if (declared > limit) throw tooLarge(limit);
  const body = c.req.raw.body;
  if (!body) throw new PoimenError("bad-json", "the body is empty");
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (size > limit) throw tooLarge(limit);
    chunks.push(chunk);
  }
  const bytes = chunks.length === 1 ? chunks[0] : concat(chunks, size);
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

function tooLarge(limit: number): PoimenError {
  return new PoimenError("body-too-large", `the body exceeds ${limit} bytes`);
}

function concat(chunks: Uint8Array[], size: number): Uint8Array {
  const out = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
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
