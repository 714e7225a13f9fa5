'use strict';
// Write outbox-relay messages inside your own node-postgres (pg) transaction: a message is
// delivered to Kafka or a webhook if and only if the business write it is published with
// commits. Thin over the SQL function outbox.enqueue_many: the database checks every limit
// (docs/sdk.md, "Limits"), and a refused message rejects with an InvalidMessage naming the
// argument, the limit and the fix; the caller's transaction is then aborted (roll it back).

/** The SQLSTATEs of the SQL API's refusals. */
const REFUSALS = new Set(['22023', '54000', '23505', '22P02', '22007', '22008']);

class InvalidMessage extends Error {
  constructor(message, hint, sqlstate) {
    super(hint ? `${message} (hint: ${hint})` : message);
    this.name = 'InvalidMessage';
    this.hint = hint || undefined;
    this.sqlstate = sqlstate || undefined;
  }
}

/** When set, supplies the trace context of a message that has none (OpenTelemetry, README). */
let traceContextProvider = null;

/**
 * Takes { traceparent, tracestate } from OpenTelemetry's active context when
 * @opentelemetry/api is installed; returns {} otherwise.
 */
function currentTraceContext() {
  if (traceContextProvider) return traceContextProvider() || {};
  let api;
  try {
    api = require('@opentelemetry/api');
  } catch (e) {
    return {};
  }
  const carrier = {};
  api.propagation.inject(api.context.active(), carrier);
  const out = {};
  if (carrier.traceparent) out.traceparent = carrier.traceparent;
  if (carrier.tracestate) out.tracestate = carrier.tracestate;
  return out;
}

/** Replaces where a message without trace context gets one (null: OpenTelemetry, if present). */
function setTraceContextProvider(fn) {
  traceContextProvider = fn;
}

function element(m, i) {
  if (m === null || typeof m !== 'object') {
    throw new InvalidMessage(`message ${i} is not an object`);
  }
  const hasJson = Object.prototype.hasOwnProperty.call(m, 'json') && m.json !== undefined;
  const hasData = m.data !== undefined && m.data !== null;
  if (hasJson === hasData) {
    throw new InvalidMessage(
      `message ${i} to ${JSON.stringify(m.destination)} needs exactly one payload: json or data`);
  }
  const e = { destination: m.destination, event_type: m.eventType || '' };
  if (hasData) {
    if (!(m.data instanceof Uint8Array)) {
      throw new InvalidMessage(`message ${i}: data must be a Buffer or Uint8Array; pass a JSON value as json`);
    }
    e.payload_base64 = Buffer.from(m.data).toString('base64');
  } else {
    e.payload = m.json;
  }
  if (m.key !== undefined && m.key !== null) e.ordering_key = m.key;
  const headers = Object.assign({}, m.headers || {});
  if (m.traceparent) {
    headers.traceparent = m.traceparent;
    if (m.tracestate) headers.tracestate = m.tracestate;
  } else if (!('traceparent' in headers)) {
    Object.assign(headers, currentTraceContext());
  }
  e.headers = headers;
  if (m.deliverAt !== undefined && m.deliverAfterMs !== undefined) {
    throw new InvalidMessage(`message ${i} sets both deliverAt and deliverAfterMs; keep one`);
  }
  if (m.deliverAt !== undefined) {
    if (!(m.deliverAt instanceof Date) || Number.isNaN(m.deliverAt.getTime())) {
      throw new InvalidMessage(`message ${i}: deliverAt must be a valid Date`);
    }
    e.deliver_after = m.deliverAt.toISOString();
  } else if (m.deliverAfterMs !== undefined) {
    e.deliver_after = new Date(Date.now() + m.deliverAfterMs).toISOString();
  }
  if (m.idempotencyKey !== undefined && m.idempotencyKey !== null) {
    e.idempotency_key = m.idempotencyKey;
  }
  return e;
}

function refused(err) {
  if (err && REFUSALS.has(err.code)) return new InvalidMessage(err.message, err.hint, err.code);
  return err;
}

/**
 * Writes every message in one statement, in the client's current transaction; resolves to
 * their ids (numbers) in input order.
 */
async function publishMany(client, messages) {
  const batch = Array.from(messages, element);
  if (batch.length === 0) return [];
  let result;
  try {
    result = await client.query('SELECT outbox.enqueue_many($1::jsonb) AS id', [JSON.stringify(batch)]);
  } catch (err) {
    throw refused(err);
  }
  return result.rows.map((r) => Number(r.id));
}

/** Writes one message in the client's current transaction; resolves to its id. */
async function publish(client, message) {
  return (await publishMany(client, [message]))[0];
}

module.exports = { publish, publishMany, InvalidMessage, currentTraceContext, setTraceContextProvider };
