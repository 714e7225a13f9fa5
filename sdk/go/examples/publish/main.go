// Publishes an order's event in the same transaction as the order's update.
//
//	OUTBOX_DATABASE_URL=postgresql://app@db/app go run ./examples/publish
package main

import (
	"context"
	"errors"
	"log"
	"os"

	"github.com/jackc/pgx/v4"

	outbox "github.com/outbox-relay/outbox-relay/sdk/go"
)

func main() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("OUTBOX_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)

	tx, err := conn.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // after Commit: a no-op
	if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY, state text)"); err != nil {
		log.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO orders VALUES (42, 'paid') ON CONFLICT (id) DO UPDATE SET state = 'paid'"); err != nil {
		log.Fatal(err)
	}
	id, err := outbox.Publish(ctx, tx, outbox.Message{
		Destination: "orders",
		JSON:        map[string]any{"order": 42, "state": "paid"},
		Key:         "order-42",
		EventType:   "order.paid",
		Headers:     map[string]string{"tenant": "acme"},
	})
	var invalid *outbox.InvalidMessageError
	if errors.As(err, &invalid) {
		log.Fatalf("refused: %v", invalid) // names the argument, the limit and the fix
	} else if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	log.Printf("order 42 paid; outbox message %d queued", id)
}
