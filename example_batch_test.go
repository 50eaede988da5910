package outbox_test

import (
	"context"
	"database/sql"
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
	"github.com/edgeoutbox/outbox/compression"
)

// On a metered link, a backlog goes out many events to a message,
// compressed; a consumer reads each event with DecodeEventsMQTT (the
// Subscriber does this for you).
func ExampleBatchOptions() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	broker := mochi.New(&mochi.Options{InlineClient: true, Logger: quiet})
	broker.AddHook(new(auth.AllowHook), nil)
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: "127.0.0.1:0"})
	broker.AddListener(tcp)
	broker.Serve()
	defer broker.Close()
	messages := make(chan []outbox.Event, 10)
	broker.Subscribe("stores/#", 1, func(_ *mochi.Client, _ packets.Subscription, pk packets.Packet) {
		var user []outbox.UserProperty
		for _, u := range pk.Properties.User {
			user = append(user, outbox.UserProperty{Key: u.Key, Value: u.Val})
		}
		evs, err := outbox.DecodeEventsMQTT(pk.Payload, pk.Properties.ContentType, user)
		if err == nil {
			messages <- evs
		}
	})

	ob, err := outbox.Open(ctx, filepath.Join(dir, "pos.db"), outbox.Options{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer ob.Close()
	// A day offline: 250 orders wait.
	ob.Transact(ctx, func(tx *sql.Tx) error {
		for i := range 250 {
			msg := outbox.Message{Topic: "stores/42/orders", Payload: fmt.Appendf(nil, `{"order":%d,"total_cents":1250}`, i)}
			if err := ob.Enqueue(ctx, tx, msg); err != nil {
				return err
			}
		}
		return nil
	})
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: "tcp://" + tcp.Address(), ClientID: "till-7"})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{
		Batch:    outbox.BatchOptions{MaxEvents: 100},
		Compress: compression.Zstd(),
	})
	if err != nil {
		log.Fatal(err)
	}
	go relay.Run(ctx)

	for got := 0; got < 250; {
		select {
		case evs := <-messages:
			fmt.Println(len(evs), "events in one message")
			got += len(evs)
		case <-time.After(10 * time.Second):
			fmt.Println("timed out")
			return
		}
	}
	// Output:
	// 100 events in one message
	// 100 events in one message
	// 50 events in one message
}
