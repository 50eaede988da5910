package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

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

// A relay drains the outbox to an MQTT broker; here an embedded one.
func ExampleOutbox_NewRelay() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// An in-process broker on a free loopback port, with a subscriber.
	broker := mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	broker.AddHook(new(auth.AllowHook), nil)
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: "127.0.0.1:0"})
	broker.AddListener(tcp)
	broker.Serve()
	defer broker.Close()
	received := make(chan outbox.Event, 1)
	broker.Subscribe("stores/#", 1, func(_ *mochi.Client, _ packets.Subscription, pk packets.Packet) {
		ev, err := outbox.DecodeEvent(pk.Payload)
		if err == nil {
			received <- ev
		}
	})

	ob, err := outbox.Open(ctx, filepath.Join(dir, "pos.db"), outbox.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer ob.Close()
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: "tcp://" + tcp.Address(), ClientID: "till-7"})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{Source: "/stores/42/tills/7"})
	if err != nil {
		log.Fatal(err)
	}
	go relay.Run(ctx)

	ob.Transact(ctx, func(tx *sql.Tx) error {
		return ob.Enqueue(ctx, tx, outbox.Message{
			Topic: "stores/42/orders", Type: "com.example.order.created", Payload: []byte(`{"order":1}`),
		})
	})

	select {
	case ev := <-received:
		fmt.Println(ev.Source, ev.Type, ev.Sequence, string(ev.Data))
	case <-time.After(10 * time.Second):
		fmt.Println("timed out")
	}
	// Output: /stores/42/tills/7 com.example.order.created 1 {"order":1}
}

// Any program that can write SQLite can use the outbox: one INSERT in its
// own transaction is the whole contract.
func Example_plainSQL() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	ob, err := outbox.Open(ctx, filepath.Join(dir, "pos.db"), outbox.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer ob.Close()

	// What a Python or shell program would run against the same file.
	if _, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('stores/42/doors', '{"open":true}')`); err != nil {
		log.Fatal(err)
	}
	recs, _ := ob.List(ctx, outbox.ListOptions{})
	fmt.Println(recs[0].Seq, recs[0].Topic, recs[0].State, len(recs[0].ID))
	// Output: 1 stores/42/doors pending 36
}

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
