package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/edgeoutbox/outbox"
)

// A device whose broker ACL allows it to publish only under its own prefix
// sets that prefix: a wrong topic then fails the transaction, instead of
// being acknowledged and dropped by a broker that refuses it silently.
func ExampleOptions_topicPrefix() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	ob, err := outbox.Open(ctx, filepath.Join(dir, "till.db"), outbox.Options{TopicPrefix: "acme/s42-till7/"})
	if err != nil {
		log.Fatal(err)
	}
	defer ob.Close()
	err = ob.Transact(ctx, func(tx *sql.Tx) error {
		return ob.Enqueue(ctx, tx, outbox.Message{Topic: "acme/s42-till8/orders", Payload: []byte(`{}`)})
	})
	fmt.Println(errors.Is(err, outbox.ErrTopicOutsidePrefix), errors.Is(err, outbox.ErrInvalidTopic))
	st, _ := ob.Stats(ctx)
	fmt.Println("pending events:", st.Pending)
	// Output:
	// true true
	// pending events: 0
}
