"""The Python writer against a real PostgreSQL with the outbox schema (run_tests.sh starts one
and sets OUTBOX_TEST_DATABASE_URL): atomicity with the caller's business write, batches, every
argument, and each bad input refused with the argument named and nothing written."""

import datetime as dt
import os
import sys
import unittest
import uuid
from unittest import mock

import psycopg
from psycopg import errors

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import outbox_writer  # noqa: E402
from outbox_writer import InvalidMessage, Message, publish, publish_many  # noqa: E402

URL = os.environ.get("OUTBOX_TEST_DATABASE_URL", "")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@unittest.skipUnless(URL, "run through sdk/python/run_tests.sh (needs a database)")
class WriterTest(unittest.TestCase):
    def setUp(self):
        with psycopg.connect(URL, autocommit=True) as c:
            c.execute("TRUNCATE outbox.messages")
            c.execute("CREATE TABLE IF NOT EXISTS app_orders (id int PRIMARY KEY, state text)")
            c.execute("TRUNCATE app_orders")

    def rows(self, where="true"):
        with psycopg.connect(URL) as c:
            return c.execute(
                "SELECT id, destination, ordering_key, idempotency_key::text, event_type, headers, "
                "payload, payload_bytes, deliver_after, created_at FROM outbox.messages WHERE "
                + where + " ORDER BY id").fetchall()

    def test_commits_with_the_business_write_and_rolls_back_with_it(self):
        with psycopg.connect(URL) as conn:
            conn.execute("INSERT INTO app_orders VALUES (1, 'paid')")
            new_id = publish(conn, Message("orders", json={"order": 1}, key="order-1"))
        self.assertEqual([r[0] for r in self.rows()], [new_id])

        conn = psycopg.connect(URL)
        try:
            conn.execute("INSERT INTO app_orders VALUES (2, 'paid')")
            publish(conn, Message("orders", json={"order": 2}, key="order-2"))
            conn.rollback()
        finally:
            conn.close()
        self.assertEqual(len(self.rows()), 1, "the rolled-back message is gone with its order")
        with psycopg.connect(URL) as c:
            self.assertEqual(c.execute("SELECT count(*) FROM app_orders").fetchone()[0], 1)

    def test_every_argument_is_stored(self):
        key = uuid.uuid4()
        later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
        with psycopg.connect(URL) as conn:
            with conn.cursor() as cur:  # a cursor works as well as the connection
                publish(cur, Message("orders", json={"a": [1, 2], "b": "x"}, key="k1",
                                     headers={"tenant": "acme"}, event_type="order.paid",
                                     deliver_after=later, idempotency_key=key,
                                     traceparent=TRACEPARENT, tracestate="congo=t61rcWkgMzE"))
            publish(conn, Message("files", data=b"\x00\xffraw", deliver_after=dt.timedelta(minutes=5)))
        (json_row, bytes_row) = self.rows()
        _, dest, okey, ikey, etype, headers, payload, payload_bytes, deliver_after, created = json_row
        self.assertEqual((dest, okey, ikey, etype), ("orders", "k1", str(key), "order.paid"))
        self.assertEqual(headers, {"tenant": "acme", "traceparent": TRACEPARENT,
                                   "tracestate": "congo=t61rcWkgMzE"})
        self.assertEqual(payload, {"a": [1, 2], "b": "x"})
        self.assertIsNone(payload_bytes)
        self.assertLess(abs((deliver_after - later).total_seconds()), 0.01)
        self.assertEqual(bytes_row[7], b"\x00\xffraw")
        self.assertIsNone(bytes_row[6])
        self.assertGreater(bytes_row[8] - bytes_row[9], dt.timedelta(minutes=4))

    def test_a_batch_is_written_in_order_in_one_statement(self):
        msgs = [Message("orders", json={"n": i}, key=f"k{i % 3}") for i in range(50)]
        msgs.append(Message("files", data=b"\x01\x02", headers={"h": "v"}, traceparent=TRACEPARENT))
        with psycopg.connect(URL) as conn:
            ids = publish_many(conn, msgs)
        self.assertEqual(len(ids), 51)
        self.assertEqual(ids, sorted(ids), "ids in input order")
        rows = self.rows()
        self.assertEqual([r[6]["n"] for r in rows[:50]], list(range(50)))
        self.assertEqual(rows[50][7], b"\x01\x02")
        self.assertEqual(rows[50][5], {"h": "v", "traceparent": TRACEPARENT})
        with psycopg.connect(URL) as conn:
            self.assertEqual(publish_many(conn, []), [])

    def assertRefused(self, message, text, many=False):
        conn = psycopg.connect(URL)
        try:
            conn.execute("INSERT INTO app_orders VALUES (9, 'paid')")
            with self.assertRaises(InvalidMessage) as ctx:
                if many:
                    publish_many(conn, [Message("orders", json={}), message])
                else:
                    publish(conn, message)
            self.assertIn(text, str(ctx.exception))
            conn.rollback()
        finally:
            conn.close()
        self.assertEqual(self.rows(), [], "nothing half-written")

    def test_bad_input_is_refused_naming_the_argument(self):
        self.assertRefused(Message("", json={}), "destination must not be empty")
        self.assertRefused(Message("orders", json={}, key="k" * 1025),
                           "ordering_key is 1025 bytes long, the limit is 1024")
        self.assertRefused(Message("orders", json={}, headers={"n": 1}), 'header "n" is not a string')
        self.assertRefused(Message("orders", json={}, deliver_after=dt.timedelta(days=400)),
                           "is more than 1 year ahead")
        self.assertRefused(Message("orders", data=b"x" * (1024 * 1024 + 1)),
                           "payload is 1048577 bytes, the limit is 1048576")
        self.assertRefused(Message("orders", json={}, traceparent="00-abc"),
                           'header "traceparent" is not a W3C traceparent')
        self.assertRefused(Message("orders", json={}, event_type="t" * 256),
                           "event_type is 256 bytes long, the limit is 255", many=True)
        # Valid JSON with a number jsonb cannot store: the database's refusal (22003) came as
        # psycopg's NumericValueOutOfRange, not an InvalidMessage.
        for many in (False, True):
            self.assertRefused(Message("orders", json_text="[1e1000000]"),
                               "value overflows numeric format", many=many)
        # A value nested deeper than the interpreter's recursion limit: json.dumps's
        # RecursionError came to the caller as it was, not as an InvalidMessage. (JSON nested
        # deeper than the server allows, 54001, cannot come from here: json_text is read with
        # json.loads first, whose limit is the same recursion limit.)
        deep = []
        for _ in range(5000):
            deep = [deep]
        for many in (False, True):
            self.assertRefused(Message("orders", json=deep),
                               "payload nests deeper than Python's json module writes", many=many)
            self.assertRefused(Message("orders", json_text="[" * 5000 + "]" * 5000),
                               "json_text is not valid JSON", many=many)
        key = uuid.uuid4()
        conn = psycopg.connect(URL)
        try:
            publish(conn, Message("orders", json={}, idempotency_key=key))
            with self.assertRaises(InvalidMessage) as ctx:
                publish(conn, Message("orders", json={}, idempotency_key=key))
            self.assertIn(f"idempotency key {key} is already queued", str(ctx.exception))
            conn.rollback()
        finally:
            conn.close()

    def test_no_event_type_reads_the_same_in_both_calls(self):
        # event_type=None: publish was refused by the database ("event_type must not be NULL",
        # the transaction aborted) while publish_many stored '' (found in review). Both store
        # no event type; what is not a str is refused naming the field, before the database.
        with psycopg.connect(URL) as conn:
            publish(conn, Message("orders", json={}, event_type=None))
            publish_many(conn, [Message("orders", json={}, event_type=None)])
        self.assertEqual([r[4] for r in self.rows()], ["", ""])
        self.setUp()
        for many in (False, True):
            with self.subTest(many=many):
                self.assertRefused(Message("orders", json={}, event_type=7),
                                   "event type must be a str", many=many)

    def test_publish_and_publish_many_refuse_the_same_input_alike(self):
        # publish bound typed parameters to outbox.enqueue(...): an int key (an entity id) was
        # sent as smallint and PostgreSQL answered "function outbox.enqueue(...) does not
        # exist" (UndefinedFunction, not InvalidMessage), and an idempotency key that is no
        # UUID drew "invalid input syntax for type uuid" naming no field (review).
        for many in (False, True):
            with self.subTest(many=many):
                self.assertRefused(Message("orders", json={}, key=42), "ordering_key", many=many)
                self.assertRefused(Message(7, json={}), "destination", many=many)
                self.assertRefused(Message("orders", json={}, idempotency_key="order-42"),
                                   "idempotency_key", many=many)

    def test_a_tracestate_without_a_traceparent_is_refused(self):
        # It was dropped without a word, and OpenTelemetry's context sent in its place.
        for many in (False, True):
            for parent in (None, ""):
                with self.subTest(many=many, parent=parent):
                    self.assertRefused(
                        Message("orders", json={}, traceparent=parent,
                                tracestate="congo=t61rcWkgMzE"),
                        "tracestate= without traceparent=", many=many)

    def test_a_trace_context_given_twice_is_refused(self):
        # traceparent=/tracestate= are the headers "traceparent"/"tracestate" (C++:
        # TraceContext is two Header calls): given in headers= as well, the explicit one
        # silently replaced the header. Refused like the C++ SDK's duplicate header.
        other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        cases = [
            (Message("orders", json={}, headers={"traceparent": other}, traceparent=TRACEPARENT),
             'header "traceparent" is set twice'),
            (Message("orders", json={}, headers={"tracestate": "a=1"}, traceparent=TRACEPARENT,
                     tracestate="congo=t61rcWkgMzE"),
             'header "tracestate" is set twice'),
        ]
        for message, text in cases:
            for many in (False, True):
                with self.subTest(text=text, many=many), psycopg.connect(URL) as conn:
                    conn.execute("INSERT INTO app_orders VALUES (9, 'paid')")
                    with self.assertRaises(InvalidMessage) as ctx:
                        if many:
                            publish_many(conn, [Message("orders", json={}), message])
                        else:
                            publish(conn, message)
                    self.assertIn(text, str(ctx.exception))
                    self.assertIn("set each header once", str(ctx.exception))
                    if many:
                        self.assertIn("message 1: ", str(ctx.exception))
                    # Refused before the database was asked: the transaction goes on.
                    self.assertEqual(conn.execute("SELECT count(*) FROM app_orders").fetchone()[0], 1)
                    conn.rollback()
        self.assertEqual(self.rows(), [], "nothing written")
        # OpenTelemetry's current span fills in only what the message does not set: not a conflict.
        otel = {"traceparent": other, "tracestate": "otel=1"}
        with mock.patch.object(outbox_writer, "current_trace_context", return_value=otel), \
                psycopg.connect(URL) as conn:
            publish(conn, Message("orders", json={}, headers={"traceparent": TRACEPARENT}))
            publish(conn, Message("orders", json={}, traceparent=TRACEPARENT))
            publish(conn, Message("orders", json={}))
            # A tracestate header of its own: the span's did not replace it (found in review).
            publish(conn, Message("orders", json={}, headers={"tracestate": "mine=1"}))
        self.assertEqual([r[5] for r in self.rows()],
                         [{"traceparent": TRACEPARENT}, {"traceparent": TRACEPARENT}, otel,
                          {"tracestate": "mine=1"}])

    def test_the_ambient_trace_context_never_refuses_the_message(self):
        # OpenTelemetry's context was written as it came: a legal tracestate over the
        # database's 512 bytes, or a malformed traceparent from a custom propagator, aborted
        # the caller's transaction over telemetry it never passed (review). The context's
        # tracestate over 512 bytes is dropped, and both when its traceparent is malformed.
        long_state = ",".join(f"v{i}=" + "x" * 40 for i in range(14))  # 600 bytes
        cases = [({"traceparent": TRACEPARENT, "tracestate": long_state},
                  {"traceparent": TRACEPARENT}),
                 ({"traceparent": "00-abc", "tracestate": "k=v"}, {}),
                 ({"traceparent": TRACEPARENT, "tracestate": "k=\ud800"},
                  {"traceparent": TRACEPARENT}),
                 ({"traceparent": TRACEPARENT, "tracestate": "k=v"},
                  {"traceparent": TRACEPARENT, "tracestate": "k=v"})]
        for many in (False, True):
            for otel, stored in cases:
                with self.subTest(many=many, otel=otel["traceparent"]):
                    self.setUp()
                    with mock.patch.object(outbox_writer, "current_trace_context",
                                           return_value=otel), psycopg.connect(URL) as conn:
                        if many:
                            publish_many(conn, [Message("orders", json={})])
                        else:
                            publish(conn, Message("orders", json={}))
                    self.assertEqual([r[5] for r in self.rows()], [stored])
        # A trace context header of its own in any case (a framework's "Traceparent"): the
        # span's was added next to it (review). And none past the database's 64 headers.
        otel = {"traceparent": TRACEPARENT, "tracestate": "k=v"}
        many_headers = {f"h{i}": "v" for i in range(63)}
        for many in (False, True):
            with self.subTest(many=many, own="Traceparent"):
                self.setUp()
                with mock.patch.object(outbox_writer, "current_trace_context",
                                       return_value=otel), psycopg.connect(URL) as conn:
                    messages = [Message("orders", json={}, headers={"Traceparent": TRACEPARENT}),
                                Message("orders", json={}, headers=many_headers)]
                    if many:
                        publish_many(conn, messages)
                    else:
                        for m in messages:
                            publish(conn, m)
                self.assertEqual([r[5] for r in self.rows()],
                                 [{"Traceparent": TRACEPARENT}, many_headers])

    def test_a_message_needs_exactly_one_payload(self):
        with self.assertRaises(InvalidMessage):
            Message("orders")
        with self.assertRaises(InvalidMessage) as ctx:
            Message("orders", json={}, data=b"x")
        self.assertIn("gives two payloads (json= and data=)", str(ctx.exception))
        with self.assertRaises(InvalidMessage):
            Message("orders", data="text, not bytes")
        # A naive datetime is refused before the database is asked (no connection needed).
        with self.assertRaises(InvalidMessage) as ctx:
            publish(None, Message("orders", json={}, deliver_after=dt.datetime(2030, 1, 1)))
        self.assertIn("timezone-aware", str(ctx.exception))
        # A negative delay went in as a time in the past (due at once), where C++ refuses it.
        with self.assertRaises(InvalidMessage) as ctx:
            publish(None, Message("orders", json={}, deliver_after=dt.timedelta(minutes=-1)))
        self.assertIn("deliver_after must not be a negative timedelta", str(ctx.exception))

    def test_an_autocommit_connection_is_refused(self):
        # In autocommit mode every statement commits on its own: the message would commit
        # without the business write (or the business write without the message).
        with psycopg.connect(URL, autocommit=True) as conn:
            for target in (conn, conn.cursor()):
                with self.assertRaises(errors.NoActiveSqlTransaction) as ctx:
                    publish(target, Message("orders", json={"order": 1}))
                self.assertIn("autocommit", str(ctx.exception))
                with self.assertRaises(errors.NoActiveSqlTransaction):
                    publish_many(target, [Message("orders", json={"order": 1})])
            self.assertEqual(self.rows(), [], "nothing written on its own")
            # An explicit transaction on the same connection is the caller's transaction.
            with conn.transaction():
                conn.execute("INSERT INTO app_orders VALUES (5, 'paid')")
                publish(conn, Message("orders", json={"order": 5}))
                publish_many(conn.cursor(), [Message("orders", json={"order": 6})])
        self.assertEqual([r[6] for r in self.rows()], [{"order": 5}, {"order": 6}])

    def test_text_postgresql_cannot_hold_is_refused_naming_the_field(self):
        # NUL and unpaired surrogates: PostgreSQL text and jsonb cannot hold them, and they
        # failed as a psycopg DataError, a UnicodeEncodeError, an UntranslatableCharacter or
        # "invalid input syntax for type json" that named no field.
        cases = [
            (Message("ord\x00ers", json={}), "destination"),
            (Message("orders", json={}, key="k\ud800"), "ordering key"),
            (Message("orders", json={}, event_type="order\x00paid"), "event type"),
            (Message("orders", json={}, headers={"ten\x00ant": "acme"}), "header name"),
            (Message("orders", json={}, headers={"tenant": "ac\udc00me"}), 'header "tenant"'),
            (Message("orders", json={"a": ["x\x00y"]}), "payload"),
            (Message("orders", json={"k\ud83d": 1}), "payload"),
            (Message("orders", json={}, headers={7: "seven"}), "header name"),
            (Message("orders", json={"x": float("nan")}), "payload"),
        ]
        for message, field in cases:
            for many in (False, True):
                with self.subTest(field=field, many=many), psycopg.connect(URL) as conn:
                    conn.execute("INSERT INTO app_orders VALUES (9, 'paid')")
                    with self.assertRaises(InvalidMessage) as ctx:
                        if many:
                            publish_many(conn, [Message("orders", json={}), message])
                        else:
                            publish(conn, message)
                    self.assertIn(field, str(ctx.exception))
                    if many:
                        self.assertIn("message 1", str(ctx.exception))
                    # Refused before the database was asked: the transaction goes on.
                    self.assertEqual(conn.execute("SELECT count(*) FROM app_orders").fetchone()[0], 1)
                    conn.rollback()
        self.assertEqual(self.rows(), [], "nothing written")
        # Characters outside the BMP are fine, as are escapes that are only text.
        with psycopg.connect(URL) as conn:
            publish(conn, Message("orders", json={"e": "\U0001F600", "t": "\\u0000"}, key="\U0001F600"))
        self.assertEqual(self.rows()[0][6], {"e": "\U0001F600", "t": "\\u0000"})

    def test_a_payload_given_as_json_text_is_stored_as_written(self):
        # json= takes Python values: a float rounds 0.1000000000000000000001, and Decimal is
        # refused by json.dumps, so such numbers could not be published exactly (the Go, Java
        # and C++ writers take JSON text).
        text = '{"big": 12345678901234567890123, "p": 0.1000000000000000000001}'
        with psycopg.connect(URL) as conn:
            publish(conn, Message("orders", json_text=text, key="k"))
            publish_many(conn, [Message("orders", json={"n": 1}), Message("orders", json_text=text),
                                Message("orders", json_text=' [1e400, "\\ud83d\\ude00 \\\\u0000", "caf\u00e9"] ')])
        with psycopg.connect(URL) as c:
            got = c.execute("SELECT payload->>'big', payload->>'p', payload FROM outbox.messages "
                            "ORDER BY id").fetchall()
            last = c.execute("SELECT payload->>0, payload->>1, payload->>2 FROM outbox.messages "
                             "ORDER BY id DESC LIMIT 1").fetchone()
        self.assertEqual(len(got), 4)
        for row in (got[0], got[2]):
            self.assertEqual(row[:2], ("12345678901234567890123", "0.1000000000000000000001"))
        self.assertEqual(got[1][2], {"n": 1})
        self.assertEqual(last, ("1" + "0" * 400, "\U0001F600 \\u0000", "caf\u00e9"),
                         "a number beyond a float, a surrogate pair and an escaped backslash are fine")

    def test_json_text_jsonb_cannot_hold_is_refused_naming_the_field(self):
        cases = [
            ('{"a": 1', "json_text is not valid JSON"),
            ("", "json_text is not valid JSON"),
            ('{"a": NaN}', "json_text is not valid JSON"),
            ("[Infinity]", "json_text is not valid JSON"),
            ('{"a": "\\u0000"}', "json_text contains a NUL character"),
            ('{"k\\u0000": 1}', "json_text contains a NUL character"),
            ('["x\x00y"]', "json_text contains a NUL character"),
            ('["\\ud800"]', "json_text contains an unpaired surrogate"),
            ('["\\udc00\\ud800"]', "json_text contains an unpaired surrogate"),
            ('["x\ud800"]', "json_text contains an unpaired surrogate"),
        ]
        for text, expected in cases:
            for many in (False, True):
                with self.subTest(text=text, many=many), psycopg.connect(URL) as conn:
                    conn.execute("INSERT INTO app_orders VALUES (9, 'paid')")
                    with self.assertRaises(InvalidMessage) as ctx:
                        if many:
                            publish_many(conn, [Message("orders", json_text="{}"),
                                                Message("orders", json_text=text)])
                        else:
                            publish(conn, Message("orders", json_text=text))
                    self.assertIn(expected, str(ctx.exception))
                    if many:
                        self.assertIn("message 1: ", str(ctx.exception))
                    # Refused before the database was asked: the transaction goes on.
                    self.assertEqual(conn.execute("SELECT count(*) FROM app_orders").fetchone()[0], 1)
                    conn.rollback()
        self.assertEqual(self.rows(), [], "nothing written")

    def test_two_payloads_are_refused_naming_them(self):
        cases = [
            (dict(json=1, json_text="1"), "gives two payloads (json= and json_text=)"),
            (dict(json_text="1", data=b"x"), "gives two payloads (json_text= and data=)"),
            (dict(json=1, json_text="1", data=b"x"), "gives three payloads (json=, json_text= and data=)"),
            (dict(json_text=b"1"), "json_text must be a str"),
            (dict(json_text={"a": 1}), "json_text must be a str"),
        ]
        for kwargs, expected in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(InvalidMessage) as ctx:
                    Message("orders", **kwargs)
                self.assertIn(expected, str(ctx.exception))
        self.assertEqual(self.rows(), [], "nothing written")

    def test_a_deliver_time_without_an_offset_is_refused(self):
        class NoOffset(dt.tzinfo):  # aware in name only: utcoffset() is None
            def utcoffset(self, d):
                return None
        with self.assertRaises(InvalidMessage) as ctx:
            publish(None, Message("orders", json={}, deliver_after=dt.datetime(2030, 1, 1, tzinfo=NoOffset())))
        self.assertIn("timezone-aware", str(ctx.exception))


if __name__ == "__main__":
    unittest.main()
