"""Write outbox messages for outbox-relay inside your own psycopg 3 transaction.

    import psycopg
    from outbox_writer import Message, publish

    with psycopg.connect(url) as conn:          # one transaction, committed on exit
        conn.execute("UPDATE orders SET state = 'paid' WHERE id = %s", (42,))
        publish(conn, Message("orders", json={"order": 42, "state": "paid"},
                              key="order-42", event_type="order.paid"))

The message is written by the SQL functions outbox.enqueue / outbox.enqueue_many in the
caller's transaction: it becomes visible to the relay exactly when the business write commits,
and disappears with it on rollback. Everything is checked by the database (docs/sdk.md,
"Limits"); a refused message raises InvalidMessage and leaves the transaction to roll back.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json as _json
import uuid as _uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import psycopg
from psycopg import errors as _errors

__all__ = ["Message", "publish", "publish_many", "InvalidMessage", "current_trace_context"]

_UNSET = object()


class InvalidMessage(ValueError):
    """The database refused a message (SQLSTATE 22023 or 54000): the text names the argument,
    the limit and the fix. The transaction is aborted; roll it back."""

    def __init__(self, message: str, hint: Optional[str] = None, sqlstate: Optional[str] = None):
        super().__init__(message if not hint else f"{message} (hint: {hint})")
        self.hint = hint
        self.sqlstate = sqlstate


@dataclass(frozen=True)
class Message:
    """One outbox message. Give exactly one payload: `json` (any JSON-serialisable value) or
    `data` (bytes, delivered as application/octet-stream to webhooks)."""

    destination: str
    json: Any = _UNSET
    data: Optional[bytes] = None
    key: Optional[str] = None
    """Ordering key: messages of one destination with the same key are delivered in order."""
    headers: Mapping[str, str] = field(default_factory=dict)
    event_type: str = ""
    deliver_after: Union[None, _dt.datetime, _dt.timedelta] = None
    """Do not deliver before this time (aware datetime) or this long after now."""
    idempotency_key: Union[None, str, _uuid.UUID] = None
    """A uuid; None: a random one. Fix it to make a retried transaction write the same key."""
    traceparent: Optional[str] = None
    """W3C trace context; None: taken from OpenTelemetry's current span when it is installed."""
    tracestate: Optional[str] = None

    def __post_init__(self) -> None:
        if (self.json is _UNSET) == (self.data is None):
            raise InvalidMessage(
                f"message to {self.destination!r} needs exactly one payload: json=... or data=b'...'")
        if self.data is not None and not isinstance(self.data, (bytes, bytearray, memoryview)):
            raise InvalidMessage("data must be bytes; pass a JSON value as json=...")
        if not isinstance(self.headers, Mapping):
            raise InvalidMessage("headers must be a mapping of header name to string value")


def current_trace_context() -> dict:
    """traceparent/tracestate of OpenTelemetry's current span, or {} without OpenTelemetry."""
    try:
        from opentelemetry import propagate  # type: ignore
    except ImportError:
        return {}
    carrier: dict = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


def _headers_of(m: Message) -> dict:
    headers = dict(m.headers)
    trace = {}
    if m.traceparent is not None:
        trace["traceparent"] = m.traceparent
        if m.tracestate:
            trace["tracestate"] = m.tracestate
    elif "traceparent" not in headers:
        trace = current_trace_context()
    headers.update(trace)
    return headers


def _deliver_after(m: Message) -> Optional[str]:
    if m.deliver_after is None:
        return None
    when = m.deliver_after
    if isinstance(when, _dt.timedelta):
        when = _dt.datetime.now(_dt.timezone.utc) + when
    if when.tzinfo is None:
        raise InvalidMessage("deliver_after must be timezone-aware (or a timedelta)")
    return when.isoformat()


def _key_text(k: Union[None, str, _uuid.UUID]) -> Optional[str]:
    return None if k is None else str(k)


def _refused(e: psycopg.Error) -> InvalidMessage:
    diag = e.diag
    return InvalidMessage(diag.message_primary or str(e), diag.message_hint, diag.sqlstate)


_REFUSALS = (_errors.InvalidParameterValue, _errors.ProgramLimitExceeded, _errors.UniqueViolation,
             _errors.InvalidTextRepresentation)

_ENQUEUE_JSON = ("SELECT outbox.enqueue(%s, %s::jsonb, ordering_key => %s, headers => %s::jsonb, "
                 "event_type => %s, deliver_after => %s::timestamptz, idempotency_key => %s::uuid)")
_ENQUEUE_BYTES = _ENQUEUE_JSON.replace("%s::jsonb, ordering_key", "%s::bytea, ordering_key")


def _execute(conn_or_cursor, sql: str, params: Sequence[Any]):
    cur = conn_or_cursor.cursor() if isinstance(conn_or_cursor, psycopg.Connection) else conn_or_cursor
    try:
        cur.execute(sql, params)
        return cur.fetchall()
    except _REFUSALS as e:
        raise _refused(e) from e


def publish(conn_or_cursor, message: Message) -> int:
    """Writes `message` in the connection's (or cursor's) current transaction; returns its id."""
    m = message
    if m.data is not None:
        sql, payload = _ENQUEUE_BYTES, bytes(m.data)
    else:
        sql, payload = _ENQUEUE_JSON, _json.dumps(m.json)
    rows = _execute(conn_or_cursor, sql, (m.destination, payload, m.key, _json.dumps(_headers_of(m)),
                                          m.event_type, _deliver_after(m), _key_text(m.idempotency_key)))
    return rows[0][0]


def publish_many(conn_or_cursor, messages: Iterable[Message]) -> list:
    """Writes every message in one statement (outbox.enqueue_many); returns the ids in order.
    Takes the per-key locks of the whole batch in one global order."""
    batch = []
    for m in messages:
        e: dict = {"destination": m.destination, "headers": _headers_of(m), "event_type": m.event_type}
        if m.data is not None:
            e["payload_base64"] = base64.b64encode(bytes(m.data)).decode("ascii")
        else:
            e["payload"] = m.json
        if m.key is not None:
            e["ordering_key"] = m.key
        if m.deliver_after is not None:
            e["deliver_after"] = _deliver_after(m)
        if m.idempotency_key is not None:
            e["idempotency_key"] = _key_text(m.idempotency_key)
        batch.append(e)
    if not batch:
        return []
    rows = _execute(conn_or_cursor, "SELECT outbox.enqueue_many(%s::jsonb)", (_json.dumps(batch),))
    return [r[0] for r in rows]
