// The OpenTelemetry adapter against a real PostgreSQL (run_tests.sh sets
// OUTBOX_TEST_DATABASE_URL): a message published inside a span carries that span's context.
package otel

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/jackc/pgx/v4"
	"go.opentelemetry.io/otel/trace"

	outbox "github.com/outbox-relay/outbox-relay/sdk/go"
)

func TestAMessageCarriesTheSpanItWasPublishedIn(t *testing.T) {
	url := os.Getenv("OUTBOX_TEST_DATABASE_URL")
	if url == "" {
		t.Skip("run through sdk/go/run_tests.sh (needs a database)")
	}
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "TRUNCATE outbox.messages"); err != nil {
		t.Fatal(err)
	}
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	state, err := trace.ParseTraceState("congo=t61rcWkgMzE")
	if err != nil {
		t.Fatal(err)
	}
	span := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID,
		TraceFlags: trace.FlagsSampled, TraceState: state})
	traced := trace.ContextWithSpanContext(ctx, span)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := outbox.PublishMany(traced, tx, []outbox.Message{
		{Destination: "orders", JSON: 1},
		{Destination: "orders", JSON: 2, TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Publish(ctx, tx, outbox.Message{Destination: "orders", JSON: 3}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := c.Query(ctx, "SELECT headers::text FROM outbox.messages ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []map[string]string
	for rows.Next() {
		var text string
		rows.Scan(&text)
		var h map[string]string
		json.Unmarshal([]byte(text), &h)
		got = append(got, h)
	}
	if len(got) != 3 {
		t.Fatalf("%d rows", len(got))
	}
	if got[0]["traceparent"] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" ||
		got[0]["tracestate"] != "congo=t61rcWkgMzE" {
		t.Errorf("the span's context: %v", got[0])
	}
	if got[1]["traceparent"] != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Errorf("an explicit traceparent wins: %v", got[1])
	}
	if _, ok := got[2]["traceparent"]; ok {
		t.Errorf("no span, no trace context: %v", got[2])
	}
}
