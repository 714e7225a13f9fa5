'use strict';
// Write outbox-relay messages inside your own node-postgres (pg) transaction: a message is
// delivered to Kafka or a webhook if and only if the business write it is published with
// commits. Thin over the SQL function outbox.enqueue_many: the database checks every limit
// (docs/sdk.md, "Limits"), and a refused message rejects with an InvalidMessage naming the
// argument, the limit and the fix; the caller's transaction is then aborted (roll it back).
// Text PostgreSQL cannot hold (NUL, unpaired surrogates), and payloads JSON cannot carry (NaN,
// BigInt), are refused here, naming the field, before the database is asked; so is a client
// outside a transaction (or a pool), where the message would commit on its own. A payload given
// as JSON text (jsonText) is checked the same way and stored as written (every digit kept).

/** The SQLSTATEs of the SQL API's refusals (22003: a JSON number jsonb cannot store, 54001: JSON
 * nested deeper than the server's stack allows). */
const REFUSALS = new Set(['22023', '54000', '23505', '22P02', '22007', '22008', '22003', '54001']);

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
const MAX_HEADERS = 64; // outbox.validate_message
const W3C_TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

/**
 * The provider's trace context as the database takes it, never a refusal: telemetry the
 * caller did not pass must not abort its transaction. A traceparent that is no W3C one drops
 * both; a tracestate over 512 bytes (legal: W3C asks to propagate at least 512) is dropped.
 */
function ambientTraceContext(trace) {
  const parent = trace && trace.traceparent;
  const state = trace && trace.tracestate;
  if (typeof parent !== 'string' || !W3C_TRACEPARENT.test(parent) || parent.startsWith('ff')
      || parent.slice(3, 35) === '0'.repeat(32) || parent.slice(36, 52) === '0'.repeat(16)) {
    return {};
  }
  const out = { traceparent: parent };
  if (typeof state === 'string' && state !== '' && Buffer.byteLength(state, 'utf8') <= 512
      && !state.includes('\u0000') && state.isWellFormed?.() !== false) {
    out.tracestate = state;
  }
  return out;
}

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

/** Why PostgreSQL text cannot hold s, or null. */
function textProblem(s) {
  if (s.includes('\u0000')) return 'contains a NUL character (\\u0000), which PostgreSQL text cannot hold; remove it';
  if (/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s)) {
    return 'contains an unpaired surrogate, which is not valid UTF-8; decode the text correctly before publishing';
  }
  return null;
}

/**
 * Why jsonb cannot hold the JSON text (as JSON.stringify writes it), or null: \u0000 and
 * unpaired surrogate escapes are valid JSON that jsonb refuses. Backslashes only occur inside
 * strings, so walking the escapes is exact.
 */
function jsonTextProblem(text) {
  const unpaired = 'contains an unpaired surrogate, which is not valid UTF-8; decode the text correctly before publishing';
  let highEnd = -1; // where a high surrogate escape ended, waiting for its low half
  for (const m of text.matchAll(/\\(?:u([0-9a-fA-F]{4})|.)/gs)) {
    const code = m[1] === undefined ? -1 : parseInt(m[1], 16);
    const isLow = code >= 0xdc00 && code <= 0xdfff;
    if (highEnd >= 0 && !(isLow && m.index === highEnd)) return unpaired;
    if (code === 0) return 'contains a NUL character (\\u0000), which jsonb cannot hold; remove it, or send bytes as data';
    if (code >= 0xd800 && code <= 0xdbff) highEnd = m.index + m[0].length;
    else if (isLow && highEnd < 0) return unpaired;
    else highEnd = -1;
  }
  return highEnd >= 0 ? unpaired : null;
}

/** The JSON text of a payload, refusing what JSON.stringify would drop or change. */
function payloadText(value, where) {
  let text;
  try {
    text = JSON.stringify(value, function replacer(k, v) {
      if (typeof v === 'number' && !Number.isFinite(v)) {
        throw new InvalidMessage(`${where}payload holds ${v}, which JSON cannot carry (it would be written as null)`);
      }
      // What JSON.stringify would turn into another value (this[k] is the value before its
      // toJSON): bytes into {"type":"Buffer",...} or {"0":...}, a Map or a Set into {}.
      const original = this[k];
      if (original instanceof ArrayBuffer || ArrayBuffer.isView(original)) {
        throw new InvalidMessage(`${where}payload holds binary data (${original.constructor.name}), which JSON would write as an object of numbers; send bytes as \`data\`, or decode them into a value first`);
      }
      if (original instanceof Map || original instanceof Set) {
        const name = original instanceof Map ? 'Map' : 'Set';
        throw new InvalidMessage(`${where}payload holds a ${name}, which JSON would write as {}; convert it first (${name === 'Map' ? 'Object.fromEntries(map)' : 'Array.from(set)'})`);
      }
      return v;
    });
  } catch (e) {
    if (e instanceof InvalidMessage) throw e;
    throw new InvalidMessage(`${where}payload cannot be written as JSON: ${e.message}`);
  }
  if (text === undefined) {
    throw new InvalidMessage(`${where}payload ${typeof value === 'function' ? 'is a function' : `is ${String(value)}`}, not a JSON value`);
  }
  const problem = jsonTextProblem(text);
  if (problem) throw new InvalidMessage(`${where}payload ${problem}`);
  return text;
}

/**
 * JSON text given as jsonText, checked and sent as it is (jsonb keeps every digit of a number,
 * which a JS number cannot): it must be JSON, and hold no NUL or unpaired surrogate, as a
 * character or as an escape.
 */
function rawPayloadText(text, where) {
  if (typeof text !== 'string') {
    throw new InvalidMessage(`${where}jsonText must be a string of JSON text, got ${typeof text}; `
      + 'pass a JS value as json');
  }
  const problem = textProblem(text);
  if (problem) throw new InvalidMessage(`${where}jsonText ${problem}`);
  try {
    JSON.parse(text);
  } catch (e) {
    throw new InvalidMessage(`${where}jsonText is not valid JSON (${e.message}); pass JSON text, or a JS value as json`);
  }
  // Valid JSON: backslashes occur only inside strings, so the escape scan is exact.
  const escapes = jsonTextProblem(text);
  if (escapes) throw new InvalidMessage(`${where}jsonText ${escapes}`);
  return text;
}

function checkText(value, what, where, optional) {
  if (optional && (value === undefined || value === null)) return;
  if (typeof value !== 'string') {
    throw new InvalidMessage(`${where}${what} must be a string, got ${value === null ? 'null' : typeof value}`);
  }
  const problem = textProblem(value);
  if (problem) throw new InvalidMessage(`${where}${what} ${problem}`);
}

/** Returns [element without its JSON payload, the payload's JSON text or null]. */
function element(m, i) {
  if (m === null || typeof m !== 'object') {
    throw new InvalidMessage(`message ${i} is not an object`);
  }
  const where = `outbox: message ${i}: `;
  checkText(m.destination, 'destination', where, false);
  checkText(m.key, 'ordering key', where, true);
  checkText(m.eventType, 'event type', where, true);
  checkText(m.idempotencyKey, 'idempotency key', where, true);
  checkText(m.traceparent, 'traceparent', where, true);
  checkText(m.tracestate, 'tracestate', where, true);
  const hasJson = Object.prototype.hasOwnProperty.call(m, 'json') && m.json !== undefined;
  const hasJsonText = m.jsonText !== undefined && m.jsonText !== null;
  const hasData = m.data !== undefined && m.data !== null;
  const given = [hasJson && 'json', hasJsonText && 'jsonText', hasData && 'data'].filter(Boolean);
  if (given.length === 0) {
    throw new InvalidMessage(
      `message ${i} to ${JSON.stringify(m.destination)} needs exactly one payload: json, jsonText or data`);
  }
  if (given.length > 1) {
    throw new InvalidMessage(
      `message ${i} to ${JSON.stringify(m.destination)} gives ${given.length === 2 ? 'two' : 'three'} payloads `
      + `(${given.slice(0, -1).join(', ')} and ${given[given.length - 1]}); it needs exactly one payload: `
      + 'json, jsonText or data');
  }
  const e = { destination: m.destination, event_type: m.eventType || '' };
  if (hasData) {
    if (!(m.data instanceof Uint8Array)) {
      throw new InvalidMessage(`message ${i}: data must be a Buffer or Uint8Array; pass a JSON value as json`);
    }
    e.payload_base64 = Buffer.from(m.data).toString('base64');
  }
  if (m.key !== undefined && m.key !== null) e.ordering_key = m.key;
  if (m.headers !== undefined && m.headers !== null && (typeof m.headers !== 'object'
      || Array.isArray(m.headers) || Object.getPrototypeOf(m.headers) !== Object.prototype
      && Object.getPrototypeOf(m.headers) !== null)) {
    // A Map or a fetch Headers copies as {}: the message would go without its headers.
    throw new InvalidMessage(`${where}headers must be a plain object of header names to `
      + 'string values; convert a Map with Object.fromEntries(map)');
  }
  const headers = Object.assign({}, m.headers || {});
  // traceparent/tracestate are the headers "traceparent"/"tracestate": one given in headers as
  // well is a header set twice (refused, as by the C++ SDK). The provider fills in only a
  // message with neither.
  if (m.tracestate && !m.traceparent) {
    // It was dropped without a word (and the provider's trace context sent instead).
    throw new InvalidMessage(`${where}tracestate without traceparent: a W3C tracestate belongs `
      + 'to a traceparent; pass both, or neither');
  }
  // The trace context headers it has, in any case (a framework's "Traceparent"): the
  // provider's own went out next to them (review).
  const own = new Set(Object.keys(headers).map((name) => name.toLowerCase())
    .filter((name) => name === 'traceparent' || name === 'tracestate'));
  if (m.traceparent) {
    for (const name of m.tracestate ? ['traceparent', 'tracestate'] : ['traceparent']) {
      if (own.has(name)) {
        throw new InvalidMessage(
          `${where}header "${name}" is set twice (in headers and as ${name}); set each header once`);
      }
    }
    headers.traceparent = m.traceparent;
    if (m.tracestate) headers.tracestate = m.tracestate;
  } else if (own.size === 0) {
    const trace = ambientTraceContext(currentTraceContext());
    // The database takes 64 headers: none of the provider's past that.
    if (Object.keys(headers).length + Object.keys(trace).length <= MAX_HEADERS) {
      Object.assign(headers, trace);
    }
  }
  for (const [name, value] of Object.entries(headers)) {
    checkText(name, 'header name', where, false);
    if (typeof value === 'string') {
      checkText(value, `header "${name}"`, where, false);
    } else if (value === undefined) {
      // JSON.stringify would leave it out: the message would go without the header.
      throw new InvalidMessage(`${where}header "${name}" is not a string (undefined); `
        + 'leave the header out, or give its value');
    }
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
    if (typeof m.deliverAfterMs !== 'number' || !Number.isFinite(m.deliverAfterMs)
        || Math.abs(m.deliverAfterMs) > 8.64e15 - Date.now()) {
      throw new InvalidMessage(`${where}deliverAfterMs must be a finite number of milliseconds, `
        + `got ${typeof m.deliverAfterMs === 'number' ? m.deliverAfterMs : typeof m.deliverAfterMs}`);
    }
    if (m.deliverAfterMs < 0) {
      throw new InvalidMessage(`${where}deliverAfterMs must not be negative, got ${m.deliverAfterMs}; `
        + 'leave it out to deliver at once, or use deliverAt');
    }
    e.deliver_after = new Date(Date.now() + m.deliverAfterMs).toISOString();
  }
  if (m.idempotencyKey !== undefined && m.idempotencyKey !== null) {
    e.idempotency_key = m.idempotencyKey;
  }
  if (hasJsonText) return [e, rawPayloadText(m.jsonText, where)];
  return [e, hasJson ? payloadText(m.json, where) : null];
}

/** One element's text: the payload goes in as its JSON text, as the C++ SDK writes it. */
function elementText([e, payload]) {
  const text = JSON.stringify(e);
  return payload === null ? text : `${text.slice(0, -1)},"payload":${payload}}`;
}

/**
 * Outside a transaction block each statement commits on its own: the message would commit
 * without the business write. node-postgres >= 8.21 tells the protocol's transaction status;
 * a query still queued (a BEGIN not yet answered) runs before ours, so then we cannot tell
 * and ask the server, as with an older node-postgres: a savepoint exists only inside a
 * transaction block (SQLSTATE 25P01 outside). Released at once, before anything is written,
 * it takes no subtransaction id.
 */
async function requireTransaction(client) {
  let outside = false;
  const queued = client && (client._activeQuery || (client._queryQueue && client._queryQueue.length > 0));
  if (client && typeof client.getTransactionStatus === 'function' && !queued) {
    outside = client.getTransactionStatus() === 'I';
  } else if (client && typeof client.totalCount === 'number' && typeof client.connect === 'function') {
    outside = true; // a pg.Pool: each query on a client of its own, in autocommit
  } else if (client && typeof client.query === 'function') {
    try {
      await client.query('SAVEPOINT outbox_check; RELEASE SAVEPOINT outbox_check');
    } catch (err) {
      if (err && err.code === '25P01') outside = true;
      else throw err;
    }
  }
  if (outside) {
    const err = new Error('outbox: not inside a transaction, so the message would commit on its own, '
      + "not with your business write; run client.query('BEGIN') first (pool.query cannot be used)");
    err.code = '25P01'; // no_active_sql_transaction
    throw err;
  }
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
  await requireTransaction(client);
  let result;
  try {
    result = await client.query('SELECT outbox.enqueue_many($1::jsonb) AS id',
      [`[${batch.map(elementText).join(',')}]`]);
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
