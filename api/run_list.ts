/**
 * A tenant's runs, a page at a time (`GET /v1/runs` and the console's list):
 * keyset pagination by an opaque cursor, a page bounded by rows and bytes.
 */
import type { z } from "zod";
import { PoimenError } from "../core/errors.ts";
import { UUID_PATTERN } from "../core/uuid.ts";
import type { Sql } from "../db/pool.ts";
import { selectRuns } from "../db/runs.ts";
import { type ListRunsQuery, type Run, RUN_PAGE_MAX_BYTES } from "../contracts/runs.ts";
import { toRun } from "./run_json.ts";

/** One page of `GET /v1/runs`, and the same as the JSON text the API answers with. */
export interface ListedPage {
  runs: Run[];
  next_cursor: string | null;
  /** `{"runs":[…],"next_cursor":…}`, each run serialized once, while it was measured. */
  json: string;
}

// Rows read at a time: small while a run may carry its input and result (each
// up to about 1 MiB), so that what is read past a full page stays small too.
const CHUNK_ROWS = { plain: 64, fields: 4 };

/**
 * One page of a tenant's runs, newest first, by keyset: at most `q.limit`
 * runs and at most `maxBytes` of JSON (RUN_PAGE_MAX_BYTES), whichever comes
 * first; a first run over `maxBytes` alone is a page of one. Rows are read
 * a few at a time and the reading stops with the page, so neither the API
 * nor Postgres handles much past it; one row more than the page tells
 * whether there is a next one. `input` and `result` only with `q.fields`.
 * Shared by `GET /v1/runs` and the console (which never asks for them).
 */
export async function listRunsPage(
  sql: Sql,
  tenant: string,
  q: z.infer<typeof ListRunsQuery>,
  maxBytes: number = RUN_PAGE_MAX_BYTES,
): Promise<ListedPage> {
  const fields = q.fields ?? [];
  const query = selectRuns(sql, tenant, {
    fields,
    goalId: q.goal_id,
    dispatchKey: q.dispatch_key,
    parentRunId: q.parent_run_id,
    rootRunId: q.root_run_id,
    status: q.status,
    before: q.cursor === undefined ? undefined : decodeCursor(q.cursor),
    limit: q.limit + 1,
  });
  const runs: Run[] = [];
  const texts: string[] = [];
  // The page's frame: `{"runs":[`, `],"next_cursor":` and a cursor (a uuid in base64url).
  let bytes = '{"runs":[],"next_cursor":""}'.length + 48;
  let more = false;
  const chunk = Math.min(q.limit + 1, fields.length > 0 ? CHUNK_ROWS.fields : CHUNK_ROWS.plain);
  reading: for await (const rows of query.cursor(chunk)) {
    for (const row of rows) {
      const run = toRun(row);
      const text = JSON.stringify(run);
      const size = utf8Length(text) + (texts.length > 0 ? 1 : 0);
      if (runs.length === q.limit || (runs.length > 0 && bytes + size > maxBytes)) {
        more = true;
        break reading;
      }
      runs.push(run);
      texts.push(text);
      bytes += size;
    }
  }
  const next = more ? encodeCursor(runs[runs.length - 1].run_id) : null;
  const json = `{"runs":[${texts.join(",")}],"next_cursor":${JSON.stringify(next)}}`;
  return { runs, next_cursor: next, json };
}

/**
 * The UTF-8 length of a JSON text: `JSON.stringify` escapes lone
 * surrogates, so each surrogate here is half of a 4-byte pair.
 */
function utf8Length(s: string): number {
  let n = s.length;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) continue;
    n += c < 0x800 || (c >= 0xd800 && c <= 0xdfff) ? 1 : 2;
  }
  return n;
}

/** The cursor is opaque to clients: base64url of the last run id of a page. */
export function encodeCursor(runId: string): string {
  return btoa(runId).replaceAll("=", "");
}
/** The run id of a cursor; a validation error when it is not one of ours. */
function decodeCursor(cursor: string): string {
  let runId = "";
  try {
    runId = atob(cursor);
  } catch { /* reported below */ }
  if (!UUID_PATTERN.test(runId)) {
    throw new PoimenError("validation", "bad cursor", {
      errors: [{ path: "cursor", message: "not a cursor returned by this API" }],
    });
  }
  return runId;
}
