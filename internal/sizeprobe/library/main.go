// Command library is a minimal program using the outbox library, for the
// size figures of outboxlab bench: it opens an outbox, writes an order and
// its event in one transaction, and runs the MQTT relay.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/signal"

	"github.com/edgeoutbox/outbox"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: library DB BROKER")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ob, err := outbox.Open(ctx, os.Args[1], outbox.Options{})
	if err != nil {
		panic(err)
	}
	defer ob.Close()
	err = ob.Transact(ctx, func(tx *sql.Tx) error {
		if _, err := tx.Exec(`CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, total_cents INTEGER)`); err != nil {
			return err
		}
		if _, err := tx.Exec(`INSERT INTO orders (total_cents) VALUES (1250)`); err != nil {
			return err
		}
		return ob.Enqueue(ctx, tx, outbox.Message{Topic: "stores/42/orders", Payload: []byte(`{"total_cents":1250}`)})
	})
	if err != nil {
		panic(err)
	}
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: os.Args[2]})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{})
	if err != nil {
		panic(err)
	}
	if err := relay.Run(ctx); err != nil {
		panic(err)
	}
}
