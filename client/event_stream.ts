/**
 * A `text/event-stream` parser as the HTML standard defines it (§9.2.6):
 * lines end in CR, LF or CRLF, also across chunks; `:` lines are comments;
 * `data:` lines join with LF; `id:` sets the last event ID (kept across
 * events); `retry:` sets the reconnection time; a blank line dispatches an
 * event, and one without data is dropped. Fed decoded text chunk by chunk
 * (a `TextDecoder` in stream mode drops the BOM), it needs nothing but
 * strings, so the client stays free of dependencies.
 *
 * @module
 */

/** One dispatched event of a `text/event-stream`. */
export interface ServerSentEvent {
  /** Its `event:` field; `message` when it has none. */
  event: string;
  /** Its `data:` lines, joined with LF. */
  data: string;
  /** The last event ID once it came: its own `id:`, or an earlier event's; empty when none. */
  lastEventId: string;
}

/** Parses one stream: push each chunk of text as it arrives, get the events it completed. */
export class EventStreamParser {
  #rest = "";
  #afterCR = false;
  #event = "";
  #data = "";
  #lastEventId = "";
  #retryMs: number | undefined;
  #comments: string[] = [];

  /** The reconnection time the stream last asked for (`retry:`), in ms; undefined until it does. */
  get retryMs(): number | undefined {
    return this.#retryMs;
  }

  /**
   * The comment lines (without the `:` and one leading space) seen since
   * the last call, oldest first: poimen ends a stream at its lifetime with
   * `: reconnect…`.
   */
  takeComments(): string[] {
    const comments = this.#comments;
    this.#comments = [];
    return comments;
  }

  /** The last event ID the stream set, dispatched or not yet. */
  get lastEventId(): string {
    return this.#lastEventId;
  }

  /** Feeds the next chunk; returns the events whose blank line it contained. */
  push(chunk: string): ServerSentEvent[] {
    // A CR that ended the last chunk ended its line: an LF opening this one is its pair.
    if (this.#afterCR && chunk.startsWith("\n")) chunk = chunk.slice(1);
    this.#afterCR = false;
    const text = this.#rest + chunk;
    const events: ServerSentEvent[] = [];
    let start = 0;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      const line = text.slice(start, i);
      if (c === 13) {
        if (i + 1 === text.length) this.#afterCR = true;
        else if (text.charCodeAt(i + 1) === 10) i++;
      }
      start = i + 1;
      const event = this.#line(line);
      if (event) events.push(event);
    }
    this.#rest = text.slice(start);
    return events;
  }

  #line(line: string): ServerSentEvent | undefined {
    if (line === "") return this.#dispatch();
    if (line.startsWith(":")) {
      // Bounded: a stream of comments alone keeps only the last few.
      if (this.#comments.length >= 16) this.#comments.shift();
      this.#comments.push(line.slice(line.startsWith(": ") ? 2 : 1));
      return undefined;
    }
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "event":
        this.#event = value;
        break;
      case "data":
        this.#data += value + "\n";
        break;
      case "id":
        if (!value.includes("\0")) this.#lastEventId = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) this.#retryMs = Number(value);
        break;
    }
    return undefined;
  }

  #dispatch(): ServerSentEvent | undefined {
    const data = this.#data;
    const event = this.#event || "message";
    this.#data = "";
    this.#event = "";
    if (data === "") return undefined;
    return { event, data: data.slice(0, -1), lastEventId: this.#lastEventId };
  }
}
