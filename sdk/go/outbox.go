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
// and the caller's transaction is aborted, to be rolled back.
package outbox

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

// Message is one outbox message: the same fields as the C++ SDK and the other writers.
type Message struct {
	// Destination, as named in the relay's config (required).
	Destination string
	// Exactly one payload: JSON (any value encoding/json accepts; json.RawMessage is sent as
	// it is) or Data (bytes, delivered as application/octet-stream to webhooks).
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

// InvalidMessageError is a message the database refused (SQLSTATE 22023, 54000, 23505 or
// 22P02): Message names the argument, the limit and the fix. The transaction is aborted.
type InvalidMessageError struct {
	Message  string
	Hint     string
	SQLState string
}

func (e *InvalidMessageError) Error() string {
	if e.Hint != "" {
		return e.Message + " (hint: " + e.Hint + ")"
	}
	return e.Message
}

// Querier is what Publish needs of pgx: pgx.Tx, *pgx.Conn and *pgxpool.Pool all have it.
// Pass a transaction (or a connection inside one): outside a transaction the message
// commits on its own.
type Querier interface {
	Query(ctx context.Context, sql string, args ...interface{}) (pgx.Rows, error)
}

// SQLQuerier is what PublishSQL needs of database/sql: *sql.Tx, *sql.Conn or *sql.DB.
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
	rows, err := q.QueryContext(ctx, enqueueMany, string(batch))
	if err != nil {
		return nil, refused(err)
	}
	defer rows.Close()
	return collect(rows, len(ms))
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
		if m.Data != nil {
			b := base64.StdEncoding.EncodeToString(m.Data)
			e.PayloadBase64 = &b
		} else {
			raw, ok := m.JSON.(json.RawMessage)
			if !ok {
				var err error
				if raw, err = json.Marshal(m.JSON); err != nil {
					return nil, &InvalidMessageError{Message: fmt.Sprintf(
						"message %d to %q: JSON payload cannot be encoded: %v", i, m.Destination, err)}
				}
			}
			e.Payload = raw
		}
		if m.Key != "" {
			k := m.Key
			e.OrderingKey = &k
		}
		e.Headers = make(map[string]string, len(m.Headers)+2)
		for k, v := range m.Headers {
			e.Headers[k] = v
		}
		traceparent, tracestate := m.TraceParent, m.TraceState
		if traceparent == "" && TraceContextFrom != nil {
			if _, given := m.Headers["traceparent"]; !given {
				traceparent, tracestate = TraceContextFrom(ctx)
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

// The SQLSTATEs of the SQL API's refusals: invalid argument, limit exceeded, idempotency key
// already queued, malformed uuid or time.
var refusals = map[string]bool{"22023": true, "54000": true, "23505": true, "22P02": true,
	"22007": true, "22008": true}

func refused(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && refusals[pg.Code] {
		return &InvalidMessageError{Message: pg.Message, Hint: pg.Hint, SQLState: pg.Code}
	}
	// Another database/sql driver (lib/pq's *pq.Error has SQLState()).
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) && refusals[coded.SQLState()] {
		return &InvalidMessageError{Message: err.Error(), SQLState: coded.SQLState()}
	}
	return err
}
