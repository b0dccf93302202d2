/**
 * Traces, with Deno's built-in OpenTelemetry (it instruments `Deno.serve`
 * and `fetch`, and registers its providers with `@opentelemetry/api`): off
 * unless the standard variables turn it on (`OTEL_DENO=true`,
 * `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`…), and then a run's
 * trace spans the relay's admission of its dispatch message, the API's
 * request and each of the worker's attempts. Off, every helper here costs a
 * no-op span and reads nothing.
 *
 * A run's trace is the W3C `traceparent` of the request that admitted it
 * (stored with the run); the relay passes a dispatch message's own.
 */
import {
  type Attributes,
  type Context,
  context,
  propagation,
  ROOT_CONTEXT,
  SpanStatusCode,
  trace,
} from "@opentelemetry/api";

const tracer = trace.getTracer("poimen");

// version-traceid-parentid-flags, lower-case hex, version 00 (W3C Trace Context).
const TRACEPARENT = /^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$/;

/** `value` when it is a well-formed W3C traceparent, else undefined. */
export function validTraceparent(value: string | null | undefined): string | undefined {
  return value !== null && value !== undefined && TRACEPARENT.test(value) ? value : undefined;
}

const carrier = {
  get: (c: Record<string, string>, key: string) => c[key],
  keys: (c: Record<string, string>) => Object.keys(c),
};

/** The context of a remote parent (a traceparent from a message or a run); the root without one. */
export function remoteContext(traceparent?: string | null, tracestate?: string | null): Context {
  const parent = validTraceparent(traceparent);
  if (!parent) return ROOT_CONTEXT;
  const headers: Record<string, string> = { traceparent: parent };
  if (tracestate) headers.tracestate = tracestate;
  return propagation.extract(ROOT_CONTEXT, headers, carrier);
}

/** The active span's traceparent, when tracing is on and a span is active. */
export function activeTraceparent(): string | undefined {
  const headers: Record<string, string> = {};
  propagation.inject(context.active(), headers);
  return validTraceparent(headers.traceparent);
}

/**
 * Runs `fn` in a span called `name`, a child of `parent`: what `fn` fetches
 * carries its trace. A throw marks the span as an error and passes through.
 */
export async function inSpan<T>(
  name: string,
  parent: Context,
  attributes: Attributes,
  fn: () => Promise<T>,
): Promise<T> {
  return await tracer.startActiveSpan(name, { attributes }, parent, async (span) => {
    try {
      return await fn();
    } catch (err) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: String(err) });
      throw err;
    } finally {
      span.end();
    }
  });
}
