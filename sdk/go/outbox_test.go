// The Go writer against a real PostgreSQL with the outbox schema (run_tests.sh starts one and
// sets OUTBOX_TEST_DATABASE_URL): atomicity with the caller's business write, batches, every
// argument, database/sql, and each bad input refused with the argument named and nothing
// written.
package outbox

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	_ "github.com/jackc/pgx/v4/stdlib" // database/sql driver "pgx"
)

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	url := os.Getenv("OUTBOX_TEST_DATABASE_URL")
	if url == "" {
		t.Skip("run through sdk/go/run_tests.sh (needs a database)")
	}
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func reset(t *testing.T, c *pgx.Conn) {
	t.Helper()
	for _, s := range []string{
		"TRUNCATE outbox.messages",
		"CREATE TABLE IF NOT EXISTS app_orders (id int PRIMARY KEY, state text)",
		"TRUNCATE app_orders",
	} {
		if _, err := c.Exec(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
}

type row struct {
	id                              int64
	destination, eventType, idemKey string
	key                             *string
	headers                         map[string]string
	payload                         *string
	payloadBytes                    []byte
	deliverAfter, createdAt         time.Time
}

func rows(t *testing.T, c *pgx.Conn) []row {
	t.Helper()
	rs, err := c.Query(context.Background(),
		`SELECT id, destination, ordering_key, idempotency_key::text, event_type, headers::text,
		        payload::text, payload_bytes, deliver_after, created_at
		   FROM outbox.messages ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		var headers string
		if err := rs.Scan(&r.id, &r.destination, &r.key, &r.idemKey, &r.eventType, &headers,
			&r.payload, &r.payloadBytes, &r.deliverAfter, &r.createdAt); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(headers), &r.headers); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func TestCommitsWithTheBusinessWriteAndRollsBackWithIt(t *testing.T) {
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	tx, _ := c.Begin(ctx)
	tx.Exec(ctx, "INSERT INTO app_orders VALUES (1, 'paid')")
	id, err := Publish(ctx, tx, Message{Destination: "orders", JSON: map[string]int{"order": 1},
		Key: "order-1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx, _ = c.Begin(ctx)
	tx.Exec(ctx, "INSERT INTO app_orders VALUES (2, 'paid')")
	if _, err := Publish(ctx, tx, Message{Destination: "orders", JSON: 2, Key: "order-2"}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	got := rows(t, c)
	if len(got) != 1 || got[0].id != id {
		t.Fatalf("want only message %d, got %+v", id, got)
	}
	var orders int
	c.QueryRow(ctx, "SELECT count(*) FROM app_orders").Scan(&orders)
	if orders != 1 {
		t.Fatalf("the rolled-back order is there: %d orders", orders)
	}
}

func TestEveryArgumentIsStored(t *testing.T) {
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	later := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Microsecond)
	key := "5d0b8b7e-9f55-4a5c-9d2e-7d1f1d0f0c11"
	tx, _ := c.Begin(ctx)
	if _, err := Publish(ctx, tx, Message{Destination: "orders",
		JSON: json.RawMessage(`{"a": [1, 2], "b": "x"}`), Key: "k1",
		Headers: map[string]string{"tenant": "acme"}, EventType: "order.paid", DeliverAt: later,
		IdempotencyKey: key, TraceParent: traceparent, TraceState: "congo=t61rcWkgMzE"}); err != nil {
		t.Fatal(err)
	}
	if _, err := Publish(ctx, tx, Message{Destination: "files", Data: []byte("\x00\xffraw"),
		DeliverAfter: 5 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	tx.Commit(ctx)
	got := rows(t, c)
	if len(got) != 2 {
		t.Fatalf("want 2 rows, got %d", len(got))
	}
	j := got[0]
	if j.destination != "orders" || j.key == nil || *j.key != "k1" || j.idemKey != key ||
		j.eventType != "order.paid" {
		t.Errorf("stored %+v", j)
	}
	if j.headers["tenant"] != "acme" || j.headers["traceparent"] != traceparent ||
		j.headers["tracestate"] != "congo=t61rcWkgMzE" || len(j.headers) != 3 {
		t.Errorf("headers %v", j.headers)
	}
	if j.payload == nil || *j.payload != `{"a": [1, 2], "b": "x"}` || j.payloadBytes != nil {
		t.Errorf("payload %v / %v", j.payload, j.payloadBytes)
	}
	if !j.deliverAfter.Equal(later) {
		t.Errorf("deliver_after %v, want %v", j.deliverAfter, later)
	}
	b := got[1]
	if string(b.payloadBytes) != "\x00\xffraw" || b.payload != nil || b.key != nil {
		t.Errorf("bytes row %+v", b)
	}
	if d := b.deliverAfter.Sub(b.createdAt); d < 4*time.Minute {
		t.Errorf("deliver_after only %v after created_at", d)
	}
}

// JSON given as []byte (what json.Marshal returns) is JSON text, as json.RawMessage is:
// encoding/json wrote it as a base64 string, so the payload became "eyJhIjoxfQ==" (found in
// review). Bytes that are not JSON are refused naming the payload and Data.
func TestJSONGivenAsBytesIsJSONText(t *testing.T) {
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	tx, _ := c.Begin(ctx)
	if _, err := Publish(ctx, tx, Message{Destination: "orders", JSON: []byte(`{"a":1}`)}); err != nil {
		t.Fatal(err)
	}
	_, err := Publish(ctx, tx, Message{Destination: "orders", JSON: []byte("\x01\x02")})
	var bad *InvalidMessageError
	if !errors.As(err, &bad) || !strings.Contains(err.Error(), "payload") ||
		!strings.Contains(err.Error(), "Data") {
		t.Errorf("bytes that are not JSON: %v", err)
	}
	tx.Commit(ctx)
	got := rows(t, c)
	if len(got) != 1 || got[0].payload == nil || *got[0].payload != `{"a": 1}` {
		t.Fatalf("stored %+v", got)
	}
}

func TestABatchIsWrittenInOrderInOneStatement(t *testing.T) {
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	var ms []Message
	for i := 0; i < 50; i++ {
		ms = append(ms, Message{Destination: "orders", JSON: map[string]int{"n": i},
			Key: []string{"k0", "k1", "k2"}[i%3]})
	}
	ms = append(ms, Message{Destination: "files", Data: []byte{1, 2},
		Headers: map[string]string{"h": "v"}, TraceParent: traceparent})
	tx, _ := c.Begin(ctx)
	ids, err := PublishMany(ctx, tx, ms)
	if err != nil {
		t.Fatal(err)
	}
	tx.Commit(ctx)
	if len(ids) != 51 {
		t.Fatalf("%d ids", len(ids))
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Fatalf("ids not in input order: %v", ids)
		}
	}
	got := rows(t, c)
	for i := 0; i < 50; i++ {
		var p map[string]int
		json.Unmarshal([]byte(*got[i].payload), &p)
		if p["n"] != i {
			t.Fatalf("row %d holds %v", i, p)
		}
	}
	if string(got[50].payloadBytes) != "\x01\x02" || got[50].headers["traceparent"] != traceparent {
		t.Errorf("last row %+v", got[50])
	}
	none, err := PublishMany(ctx, c, nil)
	if err != nil || len(none) != 0 {
		t.Errorf("empty batch: %v %v", none, err)
	}
}

func TestDatabaseSQLWritesInTheCallersTransaction(t *testing.T) {
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	db, err := sql.Open("pgx", os.Getenv("OUTBOX_TEST_DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, _ := db.BeginTx(ctx, nil)
	tx.ExecContext(ctx, "INSERT INTO app_orders VALUES (3, 'paid')")
	id, err := PublishSQL(ctx, tx, Message{Destination: "orders", JSON: "paid", Key: "order-3"})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := PublishManySQL(ctx, tx, []Message{{Destination: "orders", JSON: 1},
		{Destination: "orders", JSON: 2}})
	if err != nil || len(ids) != 2 {
		t.Fatalf("%v %v", ids, err)
	}
	tx.Rollback()
	if got := rows(t, c); len(got) != 0 {
		t.Fatalf("rolled back, yet %d rows", len(got))
	}
	tx, _ = db.BeginTx(ctx, nil)
	id, _ = PublishSQL(ctx, tx, Message{Destination: "orders", JSON: "paid", Key: "order-3"})
	tx.Commit()
	if got := rows(t, c); len(got) != 1 || got[0].id != id {
		t.Fatalf("want message %d, got %+v", id, got)
	}
	// A refusal through database/sql is an *InvalidMessageError too.
	tx, _ = db.BeginTx(ctx, nil)
	_, err = PublishSQL(ctx, tx, Message{Destination: "", JSON: 1})
	tx.Rollback()
	var invalid *InvalidMessageError
	if !errors.As(err, &invalid) || !strings.Contains(invalid.Error(), "destination must not be empty") {
		t.Fatalf("want an InvalidMessageError, got %v", err)
	}
}

// The context's trace context never refuses a message: a legal tracestate over the database's
// 512 bytes, or a malformed traceparent from a custom propagator, aborted the caller's
// transaction over telemetry it never passed (review). Such a tracestate is dropped, and both
// when the traceparent is malformed.
func TestTheContextsTraceContextNeverRefusesTheMessage(t *testing.T) {
	ctx := context.Background()
	c := connect(t)
	longState := strings.TrimSuffix(strings.Repeat("v="+strings.Repeat("x", 40)+",", 14), ",")
	cases := []struct {
		parent, state string
		want          map[string]string
	}{
		{traceparent, longState, map[string]string{"traceparent": traceparent}},
		{"00-abc", "k=v", map[string]string{}},
		{traceparent, "k=v", map[string]string{"traceparent": traceparent, "tracestate": "k=v"}},
	}
	defer func() { TraceContextFrom = nil }()
	for _, tc := range cases {
		for _, many := range []bool{false, true} {
			reset(t, c)
			TraceContextFrom = func(context.Context) (string, string) { return tc.parent, tc.state }
			tx, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if many {
				_, err = PublishMany(ctx, tx, []Message{{Destination: "orders", JSON: 1}})
			} else {
				_, err = Publish(ctx, tx, Message{Destination: "orders", JSON: 1})
			}
			if err != nil {
				tx.Rollback(ctx)
				t.Fatalf("%q (many %v): %v", tc.parent, many, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var headers map[string]string
			if err := c.QueryRow(ctx, "SELECT headers FROM outbox.messages").Scan(&headers); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(headers, tc.want) {
				t.Errorf("%q (many %v): stored %v, want %v", tc.parent, many, headers, tc.want)
			}
		}
	}
}

// Go's http.Header spells the name "Traceparent": the context's own "traceparent" went out
// next to it (review). A trace context header in any case is the message's own; both
// spellings at once are refused before the database is asked.
func TestTraceContextHeadersAreTheMessagesOwnWhateverTheirCase(t *testing.T) {
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	TraceContextFrom = func(context.Context) (string, string) {
		return "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "otel=1"
	}
	defer func() { TraceContextFrom = nil }()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := Publish(ctx, tx, Message{Destination: "orders", JSON: 1,
		Headers: map[string]string{"Traceparent": traceparent}}); err != nil {
		t.Fatal(err)
	}
	var headers map[string]string
	if err := tx.QueryRow(ctx, "SELECT headers FROM outbox.messages").Scan(&headers); err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"Traceparent": traceparent}; !reflect.DeepEqual(headers, want) {
		t.Errorf("stored %v, want %v", headers, want)
	}
	_, err = Publish(ctx, tx, Message{Destination: "orders", JSON: 1,
		Headers: map[string]string{"Traceparent": traceparent, "traceparent": traceparent}})
	var invalid *InvalidMessageError
	if !errors.As(err, &invalid) || !strings.Contains(invalid.Error(), "set twice") {
		t.Errorf("both spellings: want an InvalidMessageError saying set twice, got %v", err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Errorf("the refusal aborted the transaction: %v", err)
	}
}

func TestTraceContextFromTheContext(t *testing.T) {
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	type span struct{}
	TraceContextFrom = func(ctx context.Context) (string, string) {
		if ctx.Value(span{}) == nil {
			return "", ""
		}
		return traceparent, "k=v"
	}
	defer func() { TraceContextFrom = nil }()
	traced := context.WithValue(ctx, span{}, true)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := PublishMany(traced, tx, []Message{
		{Destination: "orders", JSON: 1},
		{Destination: "orders", JSON: 2, TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := Publish(ctx, tx, Message{Destination: "orders", JSON: 3}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := rows(t, c)
	if got[0].headers["traceparent"] != traceparent || got[0].headers["tracestate"] != "k=v" {
		t.Errorf("from the context: %v", got[0].headers)
	}
	if got[1].headers["traceparent"] != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Errorf("an explicit traceparent wins: %v", got[1].headers)
	}
	if _, ok := got[2].headers["traceparent"]; ok {
		t.Errorf("no span, no traceparent: %v", got[2].headers)
	}
}

func TestATraceContextGivenTwiceIsRefused(t *testing.T) {
	// TraceParent/TraceState are the headers "traceparent"/"tracestate" (C++: TraceContext is
	// two Header calls): given in Headers as well, the field silently replaced the header.
	// Refused like the C++ SDK's duplicate header, before the database is asked.
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	other := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	cases := []struct {
		m    Message
		want string
	}{
		{Message{Destination: "orders", JSON: 1, Headers: map[string]string{"traceparent": other},
			TraceParent: traceparent}, `header "traceparent" is set twice`},
		{Message{Destination: "orders", JSON: 1, Headers: map[string]string{"tracestate": "a=1"},
			TraceParent: traceparent, TraceState: "congo=t61rcWkgMzE"}, `header "tracestate" is set twice`},
	}
	for _, tc := range cases {
		for _, many := range []bool{false, true} {
			tx, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO app_orders VALUES (9, 'paid')"); err != nil {
				t.Fatal(err)
			}
			if many {
				_, err = PublishMany(ctx, tx, []Message{{Destination: "orders", JSON: 1}, tc.m})
			} else {
				_, err = Publish(ctx, tx, tc.m)
			}
			var invalid *InvalidMessageError
			if !errors.As(err, &invalid) || !strings.Contains(invalid.Error(), tc.want) ||
				!strings.Contains(invalid.Error(), "set each header once") ||
				(many && !strings.Contains(invalid.Error(), "message 1")) {
				t.Errorf("%s (many %v): want an InvalidMessageError %q, got %v", tc.want, many, tc.want, err)
			}
			// Refused before the database was asked: the transaction goes on.
			var n int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM app_orders").Scan(&n); err != nil || n != 1 {
				t.Errorf("%s: the transaction did not go on: %v", tc.want, err)
			}
			tx.Rollback(ctx)
		}
	}
	if got := rows(t, c); len(got) != 0 {
		t.Fatalf("%d rows written", len(got))
	}
	// The context's trace context fills in only a message without either: not a conflict.
	TraceContextFrom = func(context.Context) (string, string) { return other, "otel=1" }
	defer func() { TraceContextFrom = nil }()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := PublishMany(ctx, tx, []Message{
		{Destination: "orders", JSON: 1, Headers: map[string]string{"traceparent": traceparent}},
		{Destination: "orders", JSON: 2, TraceParent: traceparent},
		{Destination: "orders", JSON: 3},
		// A tracestate header of its own: the span's did not replace it (found in review).
		{Destination: "orders", JSON: 4, Headers: map[string]string{"tracestate": "mine=1"}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := rows(t, c)
	if len(got) != 4 || len(got[3].headers) != 1 || got[3].headers["tracestate"] != "mine=1" {
		t.Errorf("a tracestate header of its own: %v", got[len(got)-1].headers)
	}
	if len(got[0].headers) != 1 || got[0].headers["traceparent"] != traceparent ||
		len(got[1].headers) != 1 || got[1].headers["traceparent"] != traceparent ||
		got[2].headers["traceparent"] != other || got[2].headers["tracestate"] != "otel=1" {
		t.Errorf("headers: %v, %v, %v", got[0].headers, got[1].headers, got[2].headers)
	}
}

func TestBadInputIsRefusedNamingTheArgument(t *testing.T) {
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	refused := func(m Message, want string, many bool) {
		t.Helper()
		tx, _ := c.Begin(ctx)
		defer tx.Rollback(ctx)
		tx.Exec(ctx, "INSERT INTO app_orders VALUES (9, 'paid')")
		var err error
		if many {
			_, err = PublishMany(ctx, tx, []Message{{Destination: "orders", JSON: 1}, m})
		} else {
			_, err = Publish(ctx, tx, m)
		}
		var invalid *InvalidMessageError
		if !errors.As(err, &invalid) {
			t.Fatalf("want an InvalidMessageError containing %q, got %v", want, err)
		}
		if !strings.Contains(invalid.Error(), want) {
			t.Errorf("error %q does not contain %q", invalid.Error(), want)
		}
		tx.Rollback(ctx)
		if got := rows(t, c); len(got) != 0 {
			t.Errorf("half-written: %d rows", len(got))
		}
	}
	refused(Message{Destination: "", JSON: 1}, "destination must not be empty", false)
	// The driver's error stays reachable under the InvalidMessageError (errors.As), with what
	// it carries beyond message and hint (Detail, Where, ...): it was replaced (found in review).
	{
		tx, _ := c.Begin(ctx)
		_, err := Publish(ctx, tx, Message{Destination: "orders", JSON: 1,
			Key: strings.Repeat("k", 1025)})
		tx.Rollback(ctx)
		var pgErr *pgconn.PgError
		var invalid *InvalidMessageError
		if !errors.As(err, &invalid) || !errors.As(err, &pgErr) || pgErr.Code != invalid.SQLState {
			t.Errorf("want an InvalidMessageError wrapping the *pgconn.PgError, got %#v", err)
		}
	}
	refused(Message{Destination: "orders", JSON: 1, Key: strings.Repeat("k", 1025)},
		"ordering_key is 1025 bytes long, the limit is 1024", false)
	// Valid JSON with a number jsonb cannot store: the database's refusal (22003) came as the
	// driver's error, not an InvalidMessageError.
	for _, many := range []bool{false, true} {
		refused(Message{Destination: "orders", JSON: json.RawMessage("[1e1000000]")},
			"value overflows numeric format", many)
	}
	// JSON nested deeper than the server's stack allows (54001) cannot reach it from Go:
	// encoding/json refuses nesting deeper than 10000 first, and the server's limit lies above
	// that (about 13000 at the default max_stack_depth). A Go value nested that deep came back
	// as encoding/json's error from the batch's encoding, not an InvalidMessageError.
	var deep any = []any{}
	for i := 0; i < 20000; i++ {
		deep = []any{deep}
	}
	for _, many := range []bool{false, true} {
		refused(Message{Destination: "orders", JSON: deep},
			"payload nests arrays and objects 20001 deep; at most 10000", many)
		refused(Message{Destination: "orders",
			JSON: json.RawMessage(strings.Repeat("[", 20000) + strings.Repeat("]", 20000))},
			"payload nests arrays and objects 20000 deep; at most 10000", many)
	}
	refused(Message{Destination: "orders", JSON: 1, DeliverAfter: 400 * 24 * time.Hour},
		"is more than 1 year ahead", false)
	// A negative delay went in as a time in the past (due at once), where C++ refuses it.
	refused(Message{Destination: "orders", JSON: 1, DeliverAfter: -time.Minute},
		"DeliverAfter must not be negative", false)
	refused(Message{Destination: "orders", JSON: 1, DeliverAfter: -time.Minute},
		"DeliverAfter must not be negative", true)
	refused(Message{Destination: "orders", Data: make([]byte, 1024*1024+1)},
		"payload is 1048577 bytes, the limit is 1048576", false)
	refused(Message{Destination: "orders", JSON: 1, TraceParent: "00-abc"},
		`header "traceparent" is not a W3C traceparent`, false)
	// Dropped without a word before (and the context's trace context sent instead).
	refused(Message{Destination: "orders", JSON: 1, TraceState: "congo=t61rcWkgMzE"},
		"TraceState without TraceParent", true)
	refused(Message{Destination: "orders", JSON: 1, EventType: strings.Repeat("t", 256)},
		"event_type is 256 bytes long, the limit is 255", true)
	refused(Message{Destination: "orders", JSON: 1, IdempotencyKey: "not-a-uuid"},
		"not-a-uuid", false)
	// Refused before the database is asked.
	refused(Message{Destination: "orders"}, "needs exactly one payload", false)
	refused(Message{Destination: "orders", JSON: 1, Data: []byte("x")}, "needs exactly one payload",
		false)
	refused(Message{Destination: "orders", JSON: func() {}}, "JSON payload cannot be encoded", false)

	key := "0b2d6a52-3c1f-4a8e-9d3e-2f6f1c0e5a77"
	tx, _ := c.Begin(ctx)
	defer tx.Rollback(ctx)
	if _, err := Publish(ctx, tx, Message{Destination: "orders", JSON: 1, IdempotencyKey: key}); err != nil {
		t.Fatal(err)
	}
	_, err := Publish(ctx, tx, Message{Destination: "orders", JSON: 1, IdempotencyKey: key})
	var invalid *InvalidMessageError
	if !errors.As(err, &invalid) || !strings.Contains(invalid.Error(), "idempotency key "+key+" is already queued") {
		t.Fatalf("a key queued twice: %v", err)
	}
}

func TestOutsideATransactionNothingIsWritten(t *testing.T) {
	// Outside a transaction each statement commits on its own: the message would commit
	// without the business write, or the business write without the message.
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	m := Message{Destination: "orders", JSON: 1}
	if _, err := Publish(ctx, c, m); !errors.Is(err, ErrNoTransaction) {
		t.Errorf("a *pgx.Conn outside a transaction: %v", err)
	}
	db, err := sql.Open("pgx", os.Getenv("OUTBOX_TEST_DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := PublishSQL(ctx, db, m); !errors.Is(err, ErrNoTransaction) {
		t.Errorf("a *sql.DB: %v", err)
	}
	sc, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, err := PublishManySQL(ctx, sc, []Message{m}); !errors.Is(err, ErrNoTransaction) {
		t.Errorf("a *sql.Conn outside a transaction: %v", err)
	}
	if got := rows(t, c); len(got) != 0 {
		t.Fatalf("written outside a transaction: %d rows", len(got))
	}
	// A connection inside a transaction it began itself is the caller's transaction.
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := Publish(ctx, c, m); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ExecContext(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := PublishSQL(ctx, sc, m); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, c); len(got) != 0 {
		t.Fatalf("rolled back, yet %d rows", len(got))
	}
}

// binaryID writes itself as hex through a pointer receiver, which encoding/json uses for an
// addressable value (a slice element, a field behind a pointer).
type binaryID string

func (b *binaryID) MarshalText() ([]byte, error) { return []byte(hex.EncodeToString([]byte(*b))), nil }

// A value that marshals itself is written as it says, whatever bytes it holds: the UTF-8 check
// of Go values refused one reached through a pointer receiver (review).
func TestAValueThatMarshalsItselfIsNotCheckedForUTF8(t *testing.T) {
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := Publish(ctx, tx, Message{Destination: "orders", JSON: []binaryID{"\xff\x01"}}); err != nil {
		t.Fatal(err)
	}
	var payload string
	if err := tx.QueryRow(ctx, "SELECT payload::text FROM outbox.messages").Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if payload != `["ff01"]` {
		t.Errorf("stored %s", payload)
	}
}

func TestTextPostgreSQLCannotHoldIsRefusedNamingTheField(t *testing.T) {
	// Invalid UTF-8 was written as U+FFFD by encoding/json (the key "k\xff" became "k\uFFFD");
	// a NUL, an unpaired surrogate escape or broken JSON text failed in the database (22P05,
	// 22P02, 22021) or in json.Marshal, naming no field and aborting the caller's transaction.
	ctx := context.Background()
	c := connect(t)
	reset(t, c)
	cases := []struct {
		m     Message
		field string
	}{
		{Message{Destination: "ord\x00ers", JSON: 1}, "destination"},
		{Message{Destination: "orders", JSON: 1, Key: "k\xff"}, "ordering key"},
		{Message{Destination: "orders", JSON: 1, EventType: "order\x00paid"}, "event type"},
		{Message{Destination: "orders", JSON: 1, Headers: map[string]string{"ten\xe9ant": "acme"}}, "header name"},
		{Message{Destination: "orders", JSON: 1, Headers: map[string]string{"tenant": "ac\x00me"}}, `header "tenant"`},
		{Message{Destination: "orders", JSON: map[string]string{"a": "x\x00y"}}, "payload"},
		// A Go value's invalid UTF-8 (a string read as Latin-1): json.Marshal wrote U+FFFD in
		// its place and the message was stored changed (review).
		{Message{Destination: "orders", JSON: map[string]string{"name": "caf\xe9"}}, "payload"},
		{Message{Destination: "orders", JSON: map[string]int{"k\xff": 1}}, "payload"},
		{Message{Destination: "orders", JSON: struct{ Names []any }{[]any{"ok", "caf\xe9"}}}, "payload"},
		{Message{Destination: "orders", JSON: json.RawMessage(`{"a": "\u0000"}`)}, "payload"},
		{Message{Destination: "orders", JSON: json.RawMessage(`["\ud800"]`)}, "payload"},
		{Message{Destination: "orders", JSON: json.RawMessage("\"caf\xe9\"")}, "payload"},
		{Message{Destination: "orders", JSON: json.RawMessage(`{"a": 1`)}, "payload"},
	}
	for _, tc := range cases {
		for _, many := range []bool{false, true} {
			tx, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO app_orders VALUES (9, 'paid')"); err != nil {
				t.Fatal(err)
			}
			if many {
				_, err = PublishMany(ctx, tx, []Message{{Destination: "orders", JSON: 1}, tc.m})
			} else {
				_, err = Publish(ctx, tx, tc.m)
			}
			var invalid *InvalidMessageError
			if !errors.As(err, &invalid) || !strings.Contains(invalid.Error(), tc.field) ||
				(many && !strings.Contains(invalid.Error(), "message 1")) {
				t.Errorf("%q (many %v): want an InvalidMessageError naming %s, got %v", tc.m, many, tc.field, err)
			}
			// Refused before the database was asked: the transaction goes on.
			var n int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM app_orders").Scan(&n); err != nil || n != 1 {
				t.Errorf("%q: the transaction did not go on: %v", tc.m, err)
			}
			tx.Rollback(ctx)
		}
	}
	if got := rows(t, c); len(got) != 0 {
		t.Fatalf("%d rows written", len(got))
	}
	// Characters outside the BMP, as text or as a surrogate pair, are fine.
	tx, _ := c.Begin(ctx)
	defer tx.Rollback(ctx)
	if _, err := PublishMany(ctx, tx, []Message{
		{Destination: "orders", JSON: map[string]string{"e": "\U0001F600"}, Key: "\U0001F600"},
		{Destination: "orders", JSON: json.RawMessage(`"\ud83d\ude00 \\u0000"`)},
	}); err != nil {
		t.Fatal(err)
	}
	tx.Commit(ctx)
	got := rows(t, c)
	if *got[0].payload != "{\"e\": \"\U0001F600\"}" || *got[0].key != "\U0001F600" ||
		*got[1].payload != "\"\U0001F600 \\\\u0000\"" {
		t.Errorf("stored %q %q %q", *got[0].payload, *got[0].key, *got[1].payload)
	}
}
