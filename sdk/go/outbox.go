// Package outbox writes outbox-relay messages inside the caller's own PostgreSQL
// transaction: a message is delivered to Kafka or a webhook if and only if the business
// write it is published with commits.
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	tx.Exec(ctx, "UPDATE orders SET state = 'paid' WHERE id = $1", 42)
//	id, err := outbox.Publish(ctx, tx, outbox.Message{
//		Destination: "orders", JSON: map[string]any{"order": 42}, Key: "order-42",
//		EventType: "order.paid",
//	})
//	tx.Commit(ctx)
//
// Publish and PublishMany take a pgx (v4) transaction or connection; PublishSQL and
// PublishManySQL take a database/sql *sql.Tx (any driver). Both are thin over the SQL
// function outbox.enqueue_many, so the database checks every limit (docs/sdk.md, "Limits"): a
// refused message returns an *InvalidMessageError naming the argument, the limit and the fix,
// and the caller's transaction is aborted, to be rolled back. Text PostgreSQL cannot hold
// (invalid UTF-8, NUL) is refused before the database is asked, naming the field; a
// connection, pool or *sql.DB outside a transaction is refused with ErrNoTransaction.
package outbox

import (
	"context"
	"database/sql"
	"encoding"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

// Message is one outbox message: the same fields as the C++ SDK and the other writers.
type Message struct {
	// Destination, as named in the relay's config (required).
	Destination string
	// Exactly one payload: JSON (any value encoding/json accepts; json.RawMessage and []byte
	// are JSON text, sent as they are) or Data (bytes, delivered as application/octet-stream
	// to webhooks).
	JSON any
	Data []byte
	// Key is the ordering key: messages of one destination with the same key are delivered
	// in the order they were written. Empty: no key, no order.
	Key string
	// Headers travel with the message (Kafka headers, webhook headers).
	Headers map[string]string
	// EventType, e.g. "order.paid" (webhook subscriptions and topic templates use it).
	EventType string
	// DeliverAt: not before this time. DeliverAfter: not before now + this. Zero: now.
	DeliverAt    time.Time
	DeliverAfter time.Duration
	// IdempotencyKey, a uuid; empty: a random one. Fix it so that a retried transaction
	// writes the same key.
	IdempotencyKey string
	// W3C trace context. Empty: TraceContextFrom(ctx) when set (OpenTelemetry, see README).
	TraceParent string
	TraceState  string
}

// TraceContextFrom, when set, supplies the trace context of a message that has none, from
// the context Publish was given: set it once to OpenTelemetry's propagator (README,
// "Trace context").
var TraceContextFrom func(ctx context.Context) (traceparent, tracestate string)

// InvalidMessageError is a message the database refused (SQLSTATE 22023, 54000, 23505, 22P02,
// 22007, 22008, 22003 or 54001): Message names the argument, the limit and the fix. The
// transaction is aborted.
type InvalidMessageError struct {
	Message  string
	Hint     string
	SQLState string
	// Err is the driver's error (a *pgconn.PgError, a *pq.Error), nil for a refusal made before
	// the database was asked: errors.As reaches it, with its Detail and the rest.
	Err error
}

// Unwrap gives errors.As and errors.Is the driver's error.
func (e *InvalidMessageError) Unwrap() error { return e.Err }

func (e *InvalidMessageError) Error() string {
	if e.Hint != "" {
		return e.Message + " (hint: " + e.Hint + ")"
	}
	return e.Message
}

// ErrNoTransaction: Publish was given a connection outside a transaction, a pool or a *sql.DB,
// where the message would commit on its own instead of with the caller's business write.
// Nothing was written.
var ErrNoTransaction = errors.New("outbox: not inside a transaction, so the message would commit " +
	"on its own, not with your business write; publish on the pgx.Tx or *sql.Tx of that write")

// Querier is what Publish needs of pgx: a pgx.Tx, or a *pgx.Conn or *pgxpool.Conn inside a
// transaction it began (BEGIN). A *pgxpool.Pool, or a connection outside a transaction, is
// refused with ErrNoTransaction: there the message would commit on its own.
type Querier interface {
	Query(ctx context.Context, sql string, args ...interface{}) (pgx.Rows, error)
}

// SQLQuerier is what PublishSQL needs of database/sql: a *sql.Tx (or a *sql.Conn inside a
// transaction it began). A *sql.DB, or a pgx stdlib *sql.Conn outside a transaction, is refused
// with ErrNoTransaction.
type SQLQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

const enqueueMany = "SELECT outbox.enqueue_many($1::jsonb)"

// Publish writes m in q's transaction and returns its id.
func Publish(ctx context.Context, q Querier, m Message) (int64, error) {
	ids, err := PublishMany(ctx, q, []Message{m})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// PublishMany writes every message in one statement and returns their ids in input order.
// The per-key locks of the whole batch are taken in one global order.
func PublishMany(ctx context.Context, q Querier, ms []Message) ([]int64, error) {
	if len(ms) == 0 {
		return []int64{}, nil
	}
	batch, err := encode(ctx, ms)
	if err != nil {
		return nil, err
	}
	if err := requireTransaction(q); err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, enqueueMany, string(batch))
	if err != nil {
		return nil, refused(err)
	}
	defer rows.Close()
	return collect(rows, len(ms))
}

// PublishSQL writes m in a database/sql transaction and returns its id.
func PublishSQL(ctx context.Context, q SQLQuerier, m Message) (int64, error) {
	ids, err := PublishManySQL(ctx, q, []Message{m})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// PublishManySQL is PublishMany for database/sql.
func PublishManySQL(ctx context.Context, q SQLQuerier, ms []Message) ([]int64, error) {
	if len(ms) == 0 {
		return []int64{}, nil
	}
	batch, err := encode(ctx, ms)
	if err != nil {
		return nil, err
	}
	if err := requireTransactionSQL(ctx, q); err != nil {
		return nil, err
	}
	rows, err := q.QueryContext(ctx, enqueueMany, string(batch))
	if err != nil {
		return nil, refused(err)
	}
	defer rows.Close()
	return collect(rows, len(ms))
}

// Whether q writes in a transaction that commits with the caller's business write.
func requireTransaction(q Querier) error {
	switch v := q.(type) {
	case pgx.Tx:
		return nil
	case interface{ PgConn() *pgconn.PgConn }: // *pgx.Conn
		return txStatus(v.PgConn())
	case interface{ Conn() *pgx.Conn }: // *pgxpool.Conn
		return txStatus(v.Conn().PgConn())
	case interface {
		Begin(context.Context) (pgx.Tx, error)
	}: // *pgxpool.Pool: each query on a connection of its own, in autocommit
		return fmt.Errorf("%w (got a %T)", ErrNoTransaction, q)
	}
	return nil // a wrapper of the caller's: trusted
}

func txStatus(c *pgconn.PgConn) error {
	if c.TxStatus() == 'I' { // idle: no transaction block open
		return ErrNoTransaction
	}
	return nil
}

func requireTransactionSQL(ctx context.Context, q SQLQuerier) error {
	switch v := q.(type) {
	case *sql.DB:
		return fmt.Errorf("%w (got a *sql.DB)", ErrNoTransaction)
	case *sql.Conn: // pgx's stdlib driver tells; other drivers are trusted
		var err error
		if rawErr := v.Raw(func(driverConn any) error {
			if c, ok := driverConn.(interface{ Conn() *pgx.Conn }); ok {
				err = txStatus(c.Conn().PgConn())
			}
			return nil
		}); rawErr != nil {
			return rawErr
		}
		return err
	}
	return nil
}

// The ids enqueue_many returns, from pgx's or database/sql's rows.
func collect(rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}, n int) ([]int64, error) {
	ids := make([]int64, 0, n)
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, refused(err)
	}
	return ids, nil
}

// One element of outbox.enqueue_many's argument.
type element struct {
	Destination    string            `json:"destination"`
	Payload        json.RawMessage   `json:"payload,omitempty"`
	PayloadBase64  *string           `json:"payload_base64,omitempty"`
	OrderingKey    *string           `json:"ordering_key,omitempty"`
	Headers        map[string]string `json:"headers"`
	EventType      string            `json:"event_type"`
	DeliverAfter   *string           `json:"deliver_after,omitempty"`
	IdempotencyKey *string           `json:"idempotency_key,omitempty"`
}

func encode(ctx context.Context, ms []Message) ([]byte, error) {
	out := make([]element, 0, len(ms))
	for i, m := range ms {
		e := element{Destination: m.Destination, EventType: m.EventType}
		if (m.JSON == nil) == (m.Data == nil) {
			return nil, &InvalidMessageError{Message: fmt.Sprintf(
				"message %d to %q needs exactly one payload: JSON or Data", i, m.Destination)}
		}
		invalid := func(format string, args ...any) error {
			return &InvalidMessageError{Message: fmt.Sprintf("outbox: message %d: ", i) +
				fmt.Sprintf(format, args...)}
		}
		texts := [][2]string{{"destination", m.Destination}, {"ordering key", m.Key},
			{"event type", m.EventType}, {"idempotency key", m.IdempotencyKey},
			{"trace parent", m.TraceParent}, {"trace state", m.TraceState}}
		for name, value := range m.Headers {
			texts = append(texts, [2]string{"header name", name},
				[2]string{fmt.Sprintf("header %q", name), value})
		}
		for _, t := range texts {
			if problem := textProblem(t[1]); problem != "" {
				return nil, invalid("%s %s", t[0], problem)
			}
		}
		if m.Data != nil {
			b := base64.StdEncoding.EncodeToString(m.Data)
			e.PayloadBase64 = &b
		} else {
			raw, ok := m.JSON.(json.RawMessage)
			if b, isBytes := m.JSON.([]byte); isBytes {
				// What json.Marshal returns is JSON text, not bytes to write as a base64 string.
				raw, ok = json.RawMessage(b), true
			}
			if ok {
				if depth := jsonDepth(raw); depth > maxJSONDepth {
					return nil, invalid("%s", tooDeep(depth))
				}
				if !json.Valid(raw) {
					return nil, invalid("payload is not valid JSON; pass JSON text as json.RawMessage or []byte, a Go value, or bytes that are not JSON as Data")
				}
				if !utf8.Valid(raw) {
					return nil, invalid("payload is not valid UTF-8; convert it (from Latin-1, say) before publishing, or send bytes as Data")
				}
			} else {
				// encoding/json writes U+FFFD for invalid UTF-8 in a string or a map key: the
				// message would be stored changed, without a word.
				if path, bad := invalidUTF8(reflect.ValueOf(m.JSON), 0); bad {
					return nil, invalid("payload %s is not valid UTF-8; convert it (from Latin-1, say) before publishing, or send bytes as Data", path)
				}
				var err error
				if raw, err = json.Marshal(m.JSON); err != nil {
					return nil, invalid("JSON payload cannot be encoded: %v", err)
				}
				// encoding/json writes a value nested deeper than it reads back: the batch's
				// own encoding then failed with its error, not an InvalidMessageError.
				if depth := jsonDepth(raw); depth > maxJSONDepth {
					return nil, invalid("%s", tooDeep(depth))
				}
			}
			if problem := jsonTextProblem(raw); problem != "" {
				return nil, invalid("payload %s", problem)
			}
			e.Payload = raw
		}
		if m.Key != "" {
			k := m.Key
			e.OrderingKey = &k
		}
		e.Headers = make(map[string]string, len(m.Headers)+2)
		// The trace context headers the message has, in any case: Go's http.Header writes
		// "Traceparent", and the context's own "traceparent" went out next to it (review).
		own := map[string]bool{}
		for k, v := range m.Headers {
			e.Headers[k] = v
			if lower := strings.ToLower(k); lower == "traceparent" || lower == "tracestate" {
				if own[lower] {
					return nil, invalid("header %q is set twice (header names are case-insensitive); set it once", lower)
				}
				own[lower] = true
			}
		}
		// TraceParent/TraceState are the headers "traceparent"/"tracestate": one given in
		// Headers as well is a header set twice (refused, as by the C++ SDK). The context's
		// trace context fills in only a message with neither.
		if m.TraceState != "" && m.TraceParent == "" {
			// It was dropped without a word (and the context's trace context sent instead).
			return nil, invalid("TraceState without TraceParent: a W3C tracestate belongs to a " +
				"traceparent; set both, or neither")
		}
		if m.TraceParent != "" {
			explicit := [][2]string{{"traceparent", "TraceParent"}}
			if m.TraceState != "" {
				explicit = append(explicit, [2]string{"tracestate", "TraceState"})
			}
			for _, h := range explicit {
				if own[h[0]] {
					return nil, invalid("header %q is set twice (in Headers and as %s); set each header once",
						h[0], h[1])
				}
			}
		}
		traceparent, tracestate := m.TraceParent, m.TraceState
		if traceparent == "" && TraceContextFrom != nil {
			if !own["traceparent"] && !own["tracestate"] {
				traceparent, tracestate = ambientTraceContext(TraceContextFrom(ctx))
				if len(e.Headers)+2 > maxHeaders {
					traceparent, tracestate = "", "" // the database takes 64 headers
				}
			}
		}
		if traceparent != "" {
			e.Headers["traceparent"] = traceparent
			if tracestate != "" {
				e.Headers["tracestate"] = tracestate
			}
		}
		if !m.DeliverAt.IsZero() && m.DeliverAfter != 0 {
			return nil, &InvalidMessageError{Message: fmt.Sprintf(
				"message %d to %q sets both DeliverAt and DeliverAfter; keep one", i, m.Destination)}
		}
		if m.DeliverAfter < 0 {
			return nil, &InvalidMessageError{Message: fmt.Sprintf(
				"message %d to %q: DeliverAfter must not be negative, got %v; "+
					"leave it zero to deliver at once, or use DeliverAt", i, m.Destination, m.DeliverAfter)}
		}
		when := m.DeliverAt
		if m.DeliverAfter != 0 {
			when = time.Now().Add(m.DeliverAfter)
		}
		if !when.IsZero() {
			t := when.UTC().Format(time.RFC3339Nano)
			e.DeliverAfter = &t
		}
		if m.IdempotencyKey != "" {
			k := m.IdempotencyKey
			e.IdempotencyKey = &k
		}
		out = append(out, e)
	}
	return json.Marshal(out)
}

// Why PostgreSQL text cannot hold s, or "".
func textProblem(s string) string {
	if !utf8.ValidString(s) {
		return "is not valid UTF-8; convert it (from Latin-1, say) before publishing, or send binary data as Data"
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "contains a NUL character, which PostgreSQL text cannot hold; remove it"
	}
	return ""
}

// Why jsonb cannot hold the (valid, UTF-8) JSON text, or "": \u0000 and unpaired surrogate
// escapes are valid JSON that jsonb refuses. Backslashes only occur inside strings, so
// walking the escapes is exact.
func jsonTextProblem(text []byte) string {
	const unpaired = "contains an unpaired surrogate escape (\\ud800 to \\udfff), which is not valid UTF-8"
	highEnd := -1 // where a high surrogate escape ended, waiting for its low half
	for i := 0; i < len(text); i++ {
		if text[i] != '\\' {
			continue
		}
		start := i
		i++ // the escaped character
		code := -1
		if i < len(text) && text[i] == 'u' && i+4 < len(text) {
			if v, err := strconv.ParseUint(string(text[i+1:i+5]), 16, 32); err == nil {
				code = int(v)
			}
			i += 4
		}
		isLow := code >= 0xDC00 && code <= 0xDFFF
		if highEnd >= 0 && !(isLow && start == highEnd) {
			return unpaired
		}
		switch {
		case code == 0:
			return "contains a NUL character (\\u0000), which jsonb cannot hold; remove it, or send bytes as Data"
		case code >= 0xD800 && code <= 0xDBFF:
			highEnd = i + 1
		case isLow && highEnd < 0:
			return unpaired
		default:
			highEnd = -1
		}
	}
	if highEnd >= 0 {
		return unpaired
	}
	return ""
}

// The SQLSTATEs of the SQL API's refusals: invalid argument, limit exceeded, idempotency key
// already queued, malformed uuid or time, a JSON number jsonb cannot store (1e1000000), JSON
// nested deeper than the server's stack allows.
var refusals = map[string]bool{"22023": true, "54000": true, "23505": true, "22P02": true,
	"22007": true, "22008": true, "22003": true, "54001": true}

func refused(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && refusals[pg.Code] {
		return &InvalidMessageError{Message: pg.Message, Hint: pg.Hint, SQLState: pg.Code, Err: err}
	}
	// Another database/sql driver (lib/pq's *pq.Error has SQLState()).
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) && refusals[coded.SQLState()] {
		return &InvalidMessageError{Message: err.Error(), SQLState: coded.SQLState(), Err: err}
	}
	return err
}

var (
	jsonMarshalerType = reflect.TypeOf((*json.Marshaler)(nil)).Elem()
	textMarshalerType = reflect.TypeOf((*encoding.TextMarshaler)(nil)).Elem()
)

// invalidUTF8 finds a string or map key in v, as json.Marshal would write it, that is not
// valid UTF-8, and says where ("at .Names[1]"). Values that marshal themselves (by value, or
// through a pointer where json.Marshal would take their address) are theirs.
func invalidUTF8(v reflect.Value, depth int) (string, bool) {
	p, bad := badUTF8(v, depth)
	if !bad {
		return "", false
	}
	if p == "" {
		return "(a string of it)", true
	}
	return "at " + p, true
}

// maxJSONDepth is the deepest nesting of arrays and objects encoding/json reads (and so sends
// inside a batch); PostgreSQL's jsonb refuses a little deeper, about 13000 at the default
// max_stack_depth (SQLSTATE 54001).
const maxJSONDepth = 10000

// jsonDepth is how deeply the JSON text nests arrays and objects.
func jsonDepth(b []byte) int {
	depth, most := 0, 0
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case inString:
			if escaped {
				escaped = false
			} else if c == '\\' {
				escaped = true
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			if depth > most {
				most = depth
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return most
}

func tooDeep(depth int) string {
	return fmt.Sprintf("payload nests arrays and objects %d deep; at most %d can be sent (encoding/json's limit, and jsonb's is close above it): flatten it, or send its bytes as Data", depth, maxJSONDepth)
}

// badUTF8 is invalidUTF8's walk; the path is built only for the string it finds.
func badUTF8(v reflect.Value, depth int) (string, bool) {
	if !v.IsValid() || depth > 1000 {
		return "", false
	}
	t := v.Type()
	if t.Implements(jsonMarshalerType) || t.Implements(textMarshalerType) ||
		(v.CanAddr() && (reflect.PtrTo(t).Implements(jsonMarshalerType) ||
			reflect.PtrTo(t).Implements(textMarshalerType))) {
		return "", false
	}
	switch v.Kind() {
	case reflect.String:
		return "", !utf8.ValidString(v.String())
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return badUTF8(v.Elem(), depth+1)
		}
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if f := t.Field(i); f.IsExported() && f.Tag.Get("json") != "-" {
				if p, bad := badUTF8(v.Field(i), depth+1); bad {
					return "." + f.Name + p, true
				}
			}
		}
	case reflect.Map:
		it := v.MapRange()
		for it.Next() {
			k := it.Key()
			if k.Kind() == reflect.String && !utf8.ValidString(k.String()) {
				return fmt.Sprintf("[%q] (the key)", k.String()), true
			}
			if p, bad := badUTF8(it.Value(), depth+1); bad {
				return fmt.Sprintf("[%v]", k) + p, true
			}
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "", false // bytes: written as base64
		}
		for i := 0; i < v.Len(); i++ {
			if p, bad := badUTF8(v.Index(i), depth+1); bad {
				return fmt.Sprintf("[%d]", i) + p, true
			}
		}
	}
	return "", false
}

// The most headers a message may have (outbox.validate_message).
const maxHeaders = 64

var w3cTraceparent = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// ambientTraceContext is the context's trace context as the database takes it, never a
// refusal: telemetry the caller did not pass must not abort its transaction. A traceparent
// that is no W3C one drops both; a tracestate over 512 bytes (legal: W3C asks to propagate at
// least 512) is dropped.
func ambientTraceContext(parent, state string) (string, string) {
	if !w3cTraceparent.MatchString(parent) || strings.HasPrefix(parent, "ff") ||
		parent[3:35] == strings.Repeat("0", 32) || parent[36:52] == strings.Repeat("0", 16) {
		return "", ""
	}
	if len(state) > 512 || !utf8.ValidString(state) || strings.ContainsRune(state, 0) {
		state = ""
	}
	return parent, state
}
