// Types of the outbox-relay writer for Node (index.js).

/**
 * Anything with node-postgres's query(): a pg.Client or pooled client inside a transaction
 * (after BEGIN). A client outside one, or a pg.Pool, rejects with an Error whose code is '25P01'.
 */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: Array<Record<string, unknown>> }>;
}

/** One outbox message: the same fields as the C++ SDK and the other writers. */
export interface Message {
  /** As named in the relay's config. */
  destination: string;
  /**
   * Exactly one payload: json (any JSON value), jsonText (JSON text, cast to jsonb as it is:
   * numbers keep every digit, e.g. '{"amount": 12345678901234567890123}') or data (bytes:
   * application/octet-stream). jsonText that is not JSON, or holds \u0000 or an unpaired
   * surrogate, is refused before the database is asked.
   */
  json?: unknown;
  jsonText?: string;
  data?: Uint8Array;
  /** Ordering key: messages of one destination with the same key are delivered in order. */
  key?: string | null;
  headers?: Record<string, string>;
  eventType?: string;
  /** Not before this time, or this many milliseconds from now (one of the two). */
  deliverAt?: Date;
  deliverAfterMs?: number;
  /** A uuid; absent: a random one. Fix it so that a retried transaction writes the same key. */
  idempotencyKey?: string | null;
  /** W3C trace context; absent: OpenTelemetry's active span, when @opentelemetry/api is installed.
   *  These are the headers "traceparent"/"tracestate": do not also give them in headers. */
  traceparent?: string;
  tracestate?: string;
}

/**
 * A message refused, by the writer before the database is asked (text PostgreSQL cannot hold,
 * a payload JSON cannot carry: no sqlstate, the transaction goes on) or by the database (the
 * text names the argument, the limit and the fix; the transaction is aborted).
 */
export class InvalidMessage extends Error {
  readonly hint?: string;
  readonly sqlstate?: string;
}

export function publish(client: Queryable, message: Message): Promise<number>;
export function publishMany(client: Queryable, messages: Iterable<Message>): Promise<number[]>;
export function currentTraceContext(): { traceparent?: string; tracestate?: string };
export function setTraceContextProvider(
  fn: (() => { traceparent?: string; tracestate?: string }) | null
): void;
