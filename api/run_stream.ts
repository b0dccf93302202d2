/**
 * `GET /v1/runs/{id}/events` as a server-sent event stream (`Accept:
 * text/event-stream`): the events the run already has, then each new one as
 * it commits, and the end of the stream after the run is final. Each event
 * is `id: <seq>`, `event: <type>`, `data: <the event as JSON>`, so a client
 * reconnecting with `Last-Event-ID` (the last seq it got) continues with
 * the next one, without gaps or repeats. A comment line every
 * `HEARTBEAT_MS` keeps proxies from closing an idle stream. Woken by the
 * API's `RunWatch`; the stream holds one watcher slot while open, and a
 * client that goes away frees it at once.
 */
import type { Logger } from "../core/log.ts";
import { SECOND } from "../core/time.ts";
import { delay } from "../core/time.ts";
import type { Sql } from "../db/pool.ts";
import { selectRun, selectRunEvents } from "../db/runs.ts";
import { FINAL_STATUSES } from "./run_wait.ts";
import type { RunWatch, RunWatcher } from "./run_watch.ts";
import type { RunEventRow } from "../db/runs.ts";

/** How often an idle stream gets a comment line. */
export const HEARTBEAT_MS = 15 * SECOND;

// Events read per statement while catching up.
const PAGE = 500;

const encoder = new TextEncoder();

/** The last seq a client says it has (`Last-Event-ID`); 0 when absent or not a seq. */
export function lastEventId(header: string | undefined | null): number {
  const trimmed = header?.trim() ?? "";
  return /^\d{1,9}$/.test(trimmed) ? Number(trimmed) : 0;
}

/** What a stream needs. */
export interface RunStreamDeps {
  sql: Sql;
  watch: RunWatch;
  log: Logger;
  /** An event row as the API shows it (api/runs.ts `toRunEvent`). */
  toEvent: (row: RunEventRow) => { seq: number; type: string };
  /** Comment-line interval; `HEARTBEAT_MS` by default. */
  heartbeatMs?: number;
}

/**
 * The stream's response for a run the caller may see. `watcher` is the slot
 * already taken (so a full API answers 503 before any stream starts); the
 * stream closes it when it ends, the client goes away, or the watch stops.
 */
export function runEventStream(
  deps: RunStreamDeps,
  tenantId: string,
  runId: string,
  after: number,
  watcher: RunWatcher,
  clientGone: AbortSignal,
): Response {
  const gone = new AbortController();
  const abortGone = () => gone.abort();
  clientGone.addEventListener("abort", abortGone, { once: true });
  const heartbeatMs = deps.heartbeatMs ?? HEARTBEAT_MS;
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      const write = (text: string) => controller.enqueue(encoder.encode(text));
      const pump = async () => {
        let sent = after;
        // Tells EventSource how long to wait before reconnecting.
        write("retry: 2000\n\n");
        // Each turn sends what the run has past `sent`, so even a stream
        // opened on a stopping API (a client resuming) gets what it missed.
        while (!gone.signal.aborted) {
          const epoch = deps.watch.epoch;
          const run = await selectRun(deps.sql, tenantId, runId);
          if (!run) return; // purged while followed
          let page;
          do {
            page = await selectRunEvents(deps.sql, tenantId, runId, PAGE, sent);
            for (const row of page) {
              const event = deps.toEvent(row);
              write(`id: ${event.seq}\nevent: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`);
              sent = event.seq;
            }
          } while (page.length === PAGE && !gone.signal.aborted);
          // The run was read before its events: a final run's events were all
          // committed by then, and have all been sent (those not purged).
          if (FINAL_STATUSES.has(run.status)) return;
          // A stopping API ends its streams; clients resume elsewhere.
          if (deps.watch.stopped) return;
          // Wait for the next change, with a comment line while idle.
          const moved = watcher.next(run.event_seq, epoch, gone.signal).then(() => true);
          while (!gone.signal.aborted) {
            const tick = new AbortController();
            const idle = delay(heartbeatMs, tick.signal).then(() => false);
            const changed = await Promise.race([moved, idle]);
            tick.abort();
            if (changed) break;
            write(": keep-alive\n\n");
          }
        }
      };
      pump()
        .catch((err) => {
          if (!gone.signal.aborted) {
            deps.log.warn("event stream failed", { tenant: tenantId, run_id: runId, error: err });
          }
        })
        .finally(() => {
          clientGone.removeEventListener("abort", abortGone);
          watcher.close();
          gone.abort();
          try {
            controller.close();
          } catch { /* cancelled by the client */ }
        });
    },
    cancel() {
      gone.abort();
    },
  });
  return new Response(body, {
    status: 200,
    headers: {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      // Proxies that buffer (nginx) pass each event on at once.
      "x-accel-buffering": "no",
    },
  });
}
