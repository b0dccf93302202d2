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
 *
 * Bounded in time and in memory, whatever the client does:
 * - a stream lives at most the watch's `streamLimits.maxMs`
 *   (RUN_STREAM_MAX_MS, less up to a tenth of it, so streams opened together
 *   do not all come back together): then it ends between two events with a
 *   `: reconnect` comment line, and the client resumes with `Last-Event-ID`;
 *   a run due tomorrow holds no slot for a day;
 * - it honours back-pressure: it queues at most `STREAM_BUFFER_BYTES` (plus
 *   one event) that its reader has not taken, and reads no more events from
 *   the database until the reader takes some; a reader that leaves the
 *   buffer full for `streamLimits.stallMs` (RUN_STREAM_STALL_MS) is
 *   disconnected.
 */
import type { Logger } from "../core/log.ts";
import { delay, SECOND } from "../core/time.ts";
import type { Sql } from "../db/pool.ts";
import { selectRun, selectRunEvents } from "../db/runs.ts";
import type { RunEventRow } from "../db/runs.ts";
import { FINAL_STATUSES, RECONNECT_COMMENT } from "../contracts/wire.ts";
import type { RunWatch, RunWatcher, StreamEnd } from "./run_watch.ts";

/** How often an idle stream gets a comment line. */
const HEARTBEAT_MS = 15 * SECOND;

/**
 * Bytes a stream queues for its reader before it waits for the reader to
 * take some (an event larger than this is queued alone).
 */
export const STREAM_BUFFER_BYTES = 64 * 1024;

// Events read per statement while catching up: what one stream holds
// besides its buffer while its reader is slow.
const PAGE = 100;

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

// Thrown by a write when the stream must end before it: the client went
// away (or cancelled), or its reader stalled.
class StreamEnded extends Error {
  constructor(readonly why: StreamEnd) {
    super(`stream ended: ${why}`);
  }
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
  const stats = deps.watch.streamStats;
  const { maxMs, stallMs } = deps.watch.streamLimits;
  const heartbeatMs = deps.heartbeatMs ?? HEARTBEAT_MS;
  const gone = new AbortController();
  const expired = new AbortController();
  const ending = AbortSignal.any([gone.signal, expired.signal]);
  const abortGone = () => gone.abort();
  clientGone.addEventListener("abort", abortGone, { once: true });
  // Resolved by pull() (the reader took some) or by the client going away.
  let room: PromiseWithResolvers<void> | undefined;
  gone.signal.addEventListener("abort", () => room?.resolve(), { once: true });

  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      const queued = () => STREAM_BUFFER_BYTES - (controller.desiredSize ?? STREAM_BUFFER_BYTES);
      const untrack = stats.track(() => Math.max(0, queued()));
      const full = () => (controller.desiredSize ?? 0) <= 0;
      const write = async (text: string) => {
        while (full()) {
          if (gone.signal.aborted) throw new StreamEnded("gone");
          room = Promise.withResolvers<void>();
          const timer = setTimeout(() => room?.reject(new StreamEnded("stalled")), stallMs);
          try {
            await room.promise;
          } finally {
            clearTimeout(timer);
            room = undefined;
          }
        }
        if (gone.signal.aborted) throw new StreamEnded("gone");
        controller.enqueue(encoder.encode(text));
      };
      const lifetime = setTimeout(() => expired.abort(), maxMs - Math.random() * (maxMs / 10));

      const pump = async (): Promise<StreamEnd> => {
        let sent = after;
        // Tells EventSource how long to wait before reconnecting.
        await write("retry: 2000\n\n");
        // Each turn sends what the run has past `sent`, so even a stream
        // opened on a stopping API (a client resuming) gets what it missed.
        for (;;) {
          if (gone.signal.aborted) return "gone";
          if (expired.signal.aborted) {
            // Between two events: the client's Last-Event-ID is the last one sent.
            await write(
              `: ${RECONNECT_COMMENT}: this stream reached its lifetime; ` +
                "resume with Last-Event-ID\n\n",
            );
            return "lifetime";
          }
          const epoch = deps.watch.epoch;
          const run = await selectRun(deps.sql, tenantId, runId);
          if (!run) return "final"; // purged while followed
          let page;
          do {
            // Read only with room to queue what is read (back-pressure).
            page = await selectRunEvents(deps.sql, tenantId, runId, PAGE, sent);
            for (const row of page) {
              const event = deps.toEvent(row);
              await write(
                `id: ${event.seq}\nevent: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`,
              );
              sent = event.seq;
              stats.eventsSent++;
            }
          } while (page.length === PAGE && !ending.aborted);
          if (ending.aborted) continue;
          // The run was read before its events: a final run's events were all
          // committed by then, and have all been sent (those not purged).
          if (FINAL_STATUSES.has(run.status)) return "final";
          // A stopping API ends its streams; clients resume elsewhere.
          if (deps.watch.stopped) return "stopped";
          // Wait for the next change, with a comment line while idle.
          const moved = watcher.next(run.event_seq, epoch, ending).then(() => true);
          while (!ending.aborted) {
            const tick = new AbortController();
            const idle = delay(heartbeatMs, tick.signal).then(() => false);
            const changed = await Promise.race([moved, idle]);
            tick.abort();
            if (changed) break;
            await write(": keep-alive\n\n");
          }
        }
      };

      pump()
        .catch((err): StreamEnd => {
          if (err instanceof StreamEnded) return err.why;
          if (gone.signal.aborted) return "gone";
          deps.log.warn("event stream failed", { tenant: tenantId, run_id: runId, error: err });
          return "failed";
        })
        .then((why) => {
          clearTimeout(lifetime);
          clientGone.removeEventListener("abort", abortGone);
          untrack();
          watcher.close();
          stats.ended[why]++;
          gone.abort();
          try {
            if (why === "stalled") {
              // Cut, not closed: a close would queue behind what it never reads.
              deps.log.info("event stream reader stalled: disconnected", {
                tenant: tenantId,
                run_id: runId,
              });
              controller.error(new Error("the reader stopped reading"));
            } else {
              controller.close();
            }
          } catch { /* cancelled by the client */ }
        });
    },
    pull() {
      room?.resolve();
    },
    cancel() {
      gone.abort();
    },
  }, { highWaterMark: STREAM_BUFFER_BYTES, size: (chunk) => chunk.byteLength });
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
