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
)

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
