"""Write outbox messages for outbox-relay inside your own psycopg 3 transaction.

    import psycopg
    from outbox_writer import Message, publish

    with psycopg.connect(url) as conn:          # one transaction, committed on exit
        conn.execute("UPDATE orders SET state = 'paid' WHERE id = %s", (42,))
        publish(conn, Message("orders", json={"order": 42, "state": "paid"},
                              key="order-42", event_type="order.paid"))

The message is written by the SQL functions outbox.enqueue / outbox.enqueue_many in the
caller's transaction: it becomes visible to the relay exactly when the business write commits,
and disappears with it on rollback. A payload is a Python value (json=), JSON text stored as
written, every digit of its numbers kept (json_text=), or bytes (data=). Text PostgreSQL cannot
hold (NUL, unpaired surrogates) is refused here, naming the field, before anything is written;
every limit is checked by the database (docs/sdk.md, "Limits"): a refused message raises
InvalidMessage and leaves the transaction to roll back. A connection in autocommit mode outside
a transaction block is refused (psycopg.errors.NoActiveSqlTransaction): there each statement
commits on its own.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json as _json
import re as _re
import uuid as _uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import psycopg
from psycopg import errors as _errors

__all__ = ["Message", "publish", "publish_many", "InvalidMessage", "current_trace_context"]

_UNSET = object()


class InvalidMessage(ValueError):
    """The database refused a message (SQLSTATE 22023 or 54000; 23505 for an idempotency key
    already queued, 22P02 for a value it cannot read as its type, 22003 for a JSON number jsonb
    cannot store, 54001 for JSON nested too deep): the text names the argument,
    the limit and the fix. The transaction is aborted; roll it back."""

    def __init__(self, message: str, hint: Optional[str] = None, sqlstate: Optional[str] = None):
        super().__init__(message if not hint else f"{message} (hint: {hint})")
        self.hint = hint
        self.sqlstate = sqlstate


@dataclass(frozen=True)
class Message:
    """One outbox message. Give exactly one payload: `json` (any JSON-serialisable value),
    `json_text` (JSON text, cast to jsonb as it is: numbers keep every digit, which a float
    cannot) or `data` (bytes, delivered as application/octet-stream to webhooks)."""

    destination: str
    json: Any = _UNSET
    data: Optional[bytes] = None
    key: Optional[str] = None
    """Ordering key: messages of one destination with the same key are delivered in order."""
    headers: Mapping[str, str] = field(default_factory=dict)
    event_type: Optional[str] = ""
    """The event type; "" or None: none."""
    deliver_after: Union[None, _dt.datetime, _dt.timedelta] = None
    """Do not deliver before this time (aware datetime) or this long after now."""
    idempotency_key: Union[None, str, _uuid.UUID] = None
    """A uuid; None: a random one. Fix it to make a retried transaction write the same key."""
    traceparent: Optional[str] = None
    """W3C trace context; None: taken from OpenTelemetry's current span when it is installed."""
    tracestate: Optional[str] = None
    json_text: Optional[str] = None
    """The payload as JSON text, e.g. '{"amount": 12345678901234567890123}' (instead of json=)."""

    def __post_init__(self) -> None:
        given = [name for name, there in (("json=", self.json is not _UNSET),
                                          ("json_text=", self.json_text is not None),
                                          ("data=", self.data is not None)) if there]
        needs = "needs exactly one payload: json=..., json_text='...' or data=b'...'"
        if not given:
            raise InvalidMessage(f"message to {self.destination!r} {needs}")
        if len(given) > 1:
            count = "two" if len(given) == 2 else "three"
            raise InvalidMessage(f"message to {self.destination!r} gives {count} payloads "
                                 f"({', '.join(given[:-1])} and {given[-1]}); it {needs}")
        if self.json_text is not None and not isinstance(self.json_text, str):
            raise InvalidMessage(
                f"json_text must be a str of JSON text, got {type(self.json_text).__name__}; "
                "pass a Python value as json=")
        if self.data is not None and not isinstance(self.data, (bytes, bytearray, memoryview)):
            raise InvalidMessage("data must be bytes; pass a JSON value as json=...")
        if not isinstance(self.headers, Mapping):
            raise InvalidMessage("headers must be a mapping of header name to string value")


_MAX_HEADERS = 64  # outbox.validate_message
_TRACEPARENT = _re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def _ambient(trace: dict) -> dict:
    """The ambient trace context as the database takes it, never a refusal: telemetry the
    caller did not pass must not abort its transaction. A traceparent that is no W3C one drops
    both headers; a tracestate over 512 bytes (legal: W3C asks to propagate at least 512) is
    dropped."""
    parent, state = trace.get("traceparent"), trace.get("tracestate")
    if not (isinstance(parent, str) and _TRACEPARENT.fullmatch(parent)
            and not parent.startswith("ff") and parent[3:35] != "0" * 32
            and parent[36:52] != "0" * 16):
        return {}
    out = {"traceparent": parent}
    if isinstance(state, str) and state and not _text_problem(state) \
            and len(state.encode("utf-8")) <= 512:
        out["tracestate"] = state
    return out


def current_trace_context() -> dict:
    """traceparent/tracestate of OpenTelemetry's current span, or {} without OpenTelemetry."""
    try:
        from opentelemetry import propagate  # type: ignore
    except ImportError:
        return {}
    carrier: dict = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


def _headers_of(m: Message, where: str = "") -> dict:
    """The message's headers with its trace context. traceparent=/tracestate= are the headers
    "traceparent"/"tracestate", so giving one in headers= as well is a header set twice
    (refused, as by the C++ SDK). OpenTelemetry's context is used only when the message has
    no traceparent=, nor a traceparent or tracestate header."""
    headers = dict(m.headers)
    # The trace context headers it has, in any case (a framework's "Traceparent"): the
    # current span's own went out next to them (review).
    own = {str(name).lower() for name in headers} & {"traceparent", "tracestate"}
    trace = {}
    if m.tracestate and not m.traceparent:
        # It was dropped without a word (and the current span's context sent instead).
        raise InvalidMessage(
            f"outbox: {where}tracestate= without traceparent=: a W3C tracestate belongs to a "
            "traceparent; pass both, or neither")
    if m.traceparent is not None:
        trace["traceparent"] = m.traceparent
        if m.tracestate:
            trace["tracestate"] = m.tracestate
        for name in trace:
            if name in own:
                raise InvalidMessage(
                    f'outbox: {where}header "{name}" is set twice (in headers= and as {name}=); '
                    "set each header once")
    elif not own:
        trace = _ambient(current_trace_context())
        if len(headers) + len(trace) > _MAX_HEADERS:
            trace = {}  # the database takes 64 headers
    headers.update(trace)
    return headers


def _deliver_after(m: Message) -> Optional[str]:
    if m.deliver_after is None:
        return None
    when = m.deliver_after
    if isinstance(when, _dt.timedelta):
        if when < _dt.timedelta(0):
            raise InvalidMessage(f"deliver_after must not be a negative timedelta, got {when}; "
                                 "pass None to deliver at once, or a datetime")
        when = _dt.datetime.now(_dt.timezone.utc) + when
    if when.utcoffset() is None:  # naive, or a tzinfo without an offset
        raise InvalidMessage("deliver_after must be timezone-aware (or a timedelta)")
    return when.isoformat()


def _text_problem(s: str) -> Optional[str]:
    """Why PostgreSQL text cannot hold `s`, or None."""
    if "\x00" in s:
        return "contains a NUL character (\\x00), which PostgreSQL text cannot hold; remove it"
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"contains an unpaired surrogate (U+{ord(s[e.start]):04X}), which is not valid "
                "UTF-8; decode the text correctly before publishing")
    return None


# A JSON escape: \uXXXX or \ and one character (only inside strings, so a scan is exact).
_JSON_ESCAPE = _re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", _re.S)


def _json_text_problem(text: str) -> Optional[str]:
    """Why jsonb cannot hold the valid JSON `text` (as json.dumps writes it, or json_text=), or
    None: \u0000 and unpaired surrogate escapes are valid JSON that jsonb refuses."""
    high_end = -1  # where a high surrogate escape ended, waiting for its low half
    for m in _JSON_ESCAPE.finditer(text):
        code = int(m.group(1), 16) if m.group(1) else None
        if high_end >= 0 and not (code is not None and 0xDC00 <= code <= 0xDFFF and m.start() == high_end):
            break
        if code == 0:
            return "contains a NUL character (\\u0000), which jsonb cannot hold; remove it or send bytes as data="
        if code is not None and 0xD800 <= code <= 0xDBFF:
            high_end = m.end()
        elif code is not None and 0xDC00 <= code <= 0xDFFF and high_end < 0:
            break
        else:
            high_end = -1
    else:
        if high_end < 0:
            return None
    return "contains an unpaired surrogate, which is not valid UTF-8; decode the text correctly before publishing"


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _raw_json_text(text: str, where: str) -> str:
    """json_text=, checked and returned as it is: valid JSON (RFC 8259: no NaN/Infinity), and
    no NUL or unpaired surrogate as a character or as an escape."""
    problem = _text_problem(text)
    if problem:
        raise InvalidMessage(f"outbox: {where}json_text {problem}")
    try:  # numbers stay text: no float rounding, no int digit limit
        _json.loads(text, parse_int=str, parse_float=str, parse_constant=_not_json)
    except (ValueError, RecursionError) as e:
        raise InvalidMessage(
            f"outbox: {where}json_text is not valid JSON ({e}); "
            "pass JSON text, or a Python value as json=") from e
    problem = _json_text_problem(text)
    if problem:
        raise InvalidMessage(f"outbox: {where}json_text {problem}")
    return text


def _validate(m: Message, where: str):
    """Refuses, naming the field, what PostgreSQL cannot store; returns the headers (with the
    trace context) and the JSON payload's text (None for bytes)."""
    def check(value, what):
        if isinstance(value, str):
            problem = _text_problem(value)
            if problem:
                raise InvalidMessage(f"outbox: {where}{what} {problem}")
    check(m.destination, "destination")
    check(m.key, "ordering key")
    if m.event_type is not None and not isinstance(m.event_type, str):
        raise InvalidMessage(f"outbox: {where}event type must be a str (or None for none), "
                             f"not {type(m.event_type).__name__}")
    check(m.event_type, "event type")
    headers = _headers_of(m, where)
    for name, value in headers.items():
        if not isinstance(name, str):
            raise InvalidMessage(f"outbox: {where}header name {name!r} is not a str; header names are strings")
        check(name, "header name")
        check(value, f"header {name!r}".replace("'", '"'))
    if m.idempotency_key is not None:
        check(str(m.idempotency_key), "idempotency key")
    if m.data is not None:
        return headers, None
    if m.json_text is not None:
        return headers, _raw_json_text(m.json_text, where)
    try:
        text = _json.dumps(m.json, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidMessage(f"outbox: {where}payload cannot be written as JSON: {e}") from e
    except RecursionError as e:
        # A value nested deeper than the interpreter's recursion limit (about 1000 levels):
        # the caller got the RecursionError itself.
        raise InvalidMessage(
            f"outbox: {where}payload nests deeper than Python's json module writes ({e}); "
            "flatten it, or pass its JSON text as json_text") from e
    problem = _json_text_problem(text)
    if problem:
        raise InvalidMessage(f"outbox: {where}payload {problem}")
    return headers, text


def _require_transaction(conn_or_cursor) -> None:
    """In autocommit mode outside a transaction block each statement commits on its own: the
    message would not commit or roll back with the business write."""
    conn = conn_or_cursor if isinstance(conn_or_cursor, psycopg.Connection) else getattr(
        conn_or_cursor, "connection", None)
    if (conn is not None and conn.autocommit
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE):
        raise _errors.NoActiveSqlTransaction(
            "outbox: the connection is in autocommit mode and outside a transaction, so the message "
            "would commit on its own, not with your business write; publish inside "
            "`with conn.transaction():` or on a connection without autocommit")


def _key_text(k: Union[None, str, _uuid.UUID]) -> Optional[str]:
    return None if k is None else str(k)


def _refused(e: psycopg.Error) -> InvalidMessage:
    diag = e.diag
    return InvalidMessage(diag.message_primary or str(e), diag.message_hint, diag.sqlstate)


# 22003 and 54001: a JSON number jsonb cannot store (1e1000000), JSON nested deeper than the
# server's stack allows; the message's own, like the rest (they came as the driver's errors).
_REFUSALS = (_errors.InvalidParameterValue, _errors.ProgramLimitExceeded, _errors.UniqueViolation,
             _errors.InvalidTextRepresentation, _errors.NumericValueOutOfRange,
             _errors.StatementTooComplex)


def _execute(conn_or_cursor, sql: str, params: Sequence[Any]):
    cur = conn_or_cursor.cursor() if isinstance(conn_or_cursor, psycopg.Connection) else conn_or_cursor
    try:
        cur.execute(sql, params)
        return cur.fetchall()
    except _REFUSALS as e:
        raise _refused(e) from e


def publish(conn_or_cursor, message: Message) -> int:
    """Writes `message` in the connection's (or cursor's) current transaction; returns its id.
    The same statement as publish_many (outbox.enqueue_many), as the other languages' writers:
    through typed parameters of outbox.enqueue, an int key was sent as smallint and refused as
    "function ... does not exist", and a key that is no UUID named no field."""
    return _publish(conn_or_cursor, [message], single=True)[0]


def publish_many(conn_or_cursor, messages: Iterable[Message]) -> list:
    """Writes every message in one statement (outbox.enqueue_many); returns the ids in order.
    Takes the per-key locks of the whole batch in one global order."""
    return _publish(conn_or_cursor, messages, single=False)


def _publish(conn_or_cursor, messages: Iterable[Message], single: bool) -> list:
    batch = []
    for i, m in enumerate(messages):
        headers, json_text = _validate(m, "" if single else f"message {i}: ")
        e: dict = {"destination": m.destination, "headers": headers,
                   "event_type": m.event_type or ""}
        if m.data is not None:
            e["payload_base64"] = base64.b64encode(bytes(m.data)).decode("ascii")
        if m.key is not None:
            e["ordering_key"] = m.key
        if m.deliver_after is not None:
            e["deliver_after"] = _deliver_after(m)
        if m.idempotency_key is not None:
            e["idempotency_key"] = _key_text(m.idempotency_key)
        text = _json.dumps(e)
        if json_text is not None:  # the payload's JSON text as checked, spliced in as it is
            text = f'{text[:-1]}, "payload": {json_text}}}'
        batch.append(text)
    if not batch:
        return []
    _require_transaction(conn_or_cursor)
    rows = _execute(conn_or_cursor, "SELECT outbox.enqueue_many(%s::jsonb)",
                    ("[" + ", ".join(batch) + "]",))
    return [r[0] for r in rows]
