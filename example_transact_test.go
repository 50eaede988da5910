package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/edgeoutbox/outbox"
)

// The business row and its event commit in one transaction, or neither does.
func ExampleOutbox_Transact() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	ob, err := outbox.Open(ctx, filepath.Join(dir, "pos.db"), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer ob.Close()
	if _, err := ob.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, total_cents INTEGER)`); err != nil {
		log.Fatal(err)
	}

	err = ob.Transact(ctx, func(tx *sql.Tx) error {
		res, err := tx.Exec(`INSERT INTO orders (total_cents) VALUES (1250)`)
		if err != nil {
			return err
		}
		id, _ := res.LastInsertId()
		return ob.Enqueue(ctx, tx, outbox.Message{
			Topic:   "stores/42/orders",
			Type:    "com.example.order.created",
			Payload: fmt.Appendf(nil, `{"order":%d,"total_cents":1250}`, id),
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	// A transaction that fails publishes nothing.
	_ = ob.Transact(ctx, func(tx *sql.Tx) error {
		tx.Exec(`INSERT INTO orders (total_cents) VALUES (990)`)
		ob.Enqueue(ctx, tx, outbox.Message{Topic: "stores/42/orders", Payload: []byte(`{}`)})
		return fmt.Errorf("card declined")
	})

	st, _ := ob.Stats(ctx)
	fmt.Println("pending events:", st.Pending)
	// Output: pending events: 1
}
