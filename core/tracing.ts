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
import { isTraceparent } from "../contracts/trace_context.ts";

const tracer = trace.getTracer("poimen");

/** `value` when it is a valid W3C traceparent (contracts/trace_context.ts), else undefined. */
export function validTraceparent(value: string | null | undefined): string | undefined {
  return value !== null && value !== undefined && isTraceparent(value) ? value : undefined;
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
