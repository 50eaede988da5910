package consumer_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/consumer"
)

// An event delivered twice is applied once: the handler's writes and the
// inbox's record of the event commit together.
func ExampleInbox_Apply() {
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, err := outbox.OpenDB(filepath.Join(dir, "backend.db"), outbox.DBOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE orders_seen (id TEXT PRIMARY KEY, data TEXT)`); err != nil {
		log.Fatal(err)
	}
	in, err := consumer.NewInbox(ctx, db, consumer.InboxOptions{})
	if err != nil {
		log.Fatal(err)
	}
	record := func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO orders_seen (id, data) VALUES (?, ?)`, ev.ID, string(ev.Data))
		return err
	}

	ev := outbox.Event{ID: outbox.NewID(), Source: "/stores/42/tills/7", Type: "com.example.order.created", Data: []byte(`{"order":1}`)}
	fmt.Println(in.Apply(ctx, ev, record))
	fmt.Println(errors.Is(in.Apply(ctx, ev, record), outbox.ErrDuplicate))
	var n int
	db.QueryRow(`SELECT count(*) FROM orders_seen`).Scan(&n)
	fmt.Println("orders seen:", n)
	// Output:
	// <nil>
	// true
	// orders seen: 1
}
