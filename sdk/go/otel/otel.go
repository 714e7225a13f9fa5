// Package otel makes the outbox writer take each message's trace context from OpenTelemetry:
// import it once, for its side effect, and a message published without TraceParent carries
// the W3C trace context of the span in the context it was published with.
//
//	import _ "github.com/outbox-relay/outbox-relay/sdk/go/otel"
//
// A separate package, so that the writer itself does not depend on OpenTelemetry.
package otel

import (
	"context"

	"go.opentelemetry.io/otel/propagation"

	outbox "github.com/outbox-relay/outbox-relay/sdk/go"
)

func init() {
	outbox.TraceContextFrom = TraceContext
}

// TraceContext returns the W3C traceparent and tracestate of the span in ctx ("" without a
// valid span), whatever propagator the application installed globally.
func TraceContext(ctx context.Context) (traceparent, tracestate string) {
	carrier := mapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier["traceparent"], carrier["tracestate"]
}

// A propagation.TextMapCarrier over a map.
type mapCarrier map[string]string

func (c mapCarrier) Get(key string) string { return c[key] }
func (c mapCarrier) Set(key, value string) { c[key] = value }
func (c mapCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
