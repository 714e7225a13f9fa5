module github.com/outbox-relay/outbox-relay/sdk/go

go 1.19

require (
	github.com/jackc/pgx/v4 v4.15.0
	go.opentelemetry.io/otel v1.1.0
	go.opentelemetry.io/otel/trace v1.1.0
)
