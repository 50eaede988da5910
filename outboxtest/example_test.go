package outboxtest_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/outboxtest"
)

// fakeTransport describes a transport to the suite, as a transport's own
// test does; a FakeBroker stands in for its broker here. Its test is then
// one line:
//
//	func TestConformance(t *testing.T) { outboxtest.Run(t, fakeTransport(outboxtest.RefusedForGood)) }
//
// A transport whose broker lives in another process starts it in Broker
// (or once, for the whole test) and reaches it through a fault proxy, so
// that Cut, Down, Withhold and Pause act on the Publisher's connection
// alone (tests/integration does so for MQTT).
func fakeTransport(refusal outboxtest.RefusalMode) outboxtest.Transport {
	const reason = "not authorized"
	broker := func(opts outboxtest.FakeBrokerOptions) outboxtest.Broker {
		b := outboxtest.NewFakeBroker(opts)
		b.Refuse("denied/orders", refusal, reason)
		return outboxtest.Broker{
			Publisher: func() outbox.Publisher { return b.NewPublisher() },
			Subscribe: func(got func(outbox.Event, error)) {
				b.Subscribe(func(m outboxtest.FakeMessage) { got(m.Event()) })
			},
			Topic:        "pos/orders",
			Refused:      "denied/orders",
			Cut:          b.Cut,
			Down:         func() func() { b.Down(); return b.Up },
			Withhold:     b.Withhold,
			Pause:        func() func() { b.Pause(); return b.Resume },
			PeakInFlight: b.PeakInFlight,
		}
	}
	return outboxtest.Transport{
		Features: outboxtest.Features{Refusal: refusal, RefusalReason: reason},
		Broker:   func(*testing.T) outboxtest.Broker { return broker(outboxtest.FakeBrokerOptions{}) },
		Refusing: func(*testing.T) outboxtest.Broker { return broker(outboxtest.FakeBrokerOptions{}) },
		Limited: func(_ *testing.T, limit int) outboxtest.Broker {
			return broker(outboxtest.FakeBrokerOptions{MaxInFlight: limit})
		},
	}
}

// Example shows a FakeBroker standing in for MQTT: a relay delivers three
// events to it, one of them refused for good, then sends again the one
// whose acknowledgement was withheld when the connection was cut.
func Example() {
	dir, err := os.MkdirTemp("", "outboxtest")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	ob, err := outbox.Open(ctx, filepath.Join(dir, "outbox.db"), outbox.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer ob.Close()

	b := outboxtest.NewFakeBroker(outboxtest.FakeBrokerOptions{})
	b.Refuse("denied/orders", outboxtest.RefusedForGood, "not authorized")
	delivered := make(chan int64, 10)
	b.Subscribe(func(m outboxtest.FakeMessage) {
		ev, err := m.Event()
		if err == nil {
			delivered <- ev.Sequence
		}
	})
	r, err := ob.NewRelay(b.NewPublisher(), outbox.RelayOptions{Reconnect: outbox.Backoff{Initial: time.Millisecond}})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	commit := func(topic string) {
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: topic, Payload: []byte(`{}`)})
		})
		if err != nil {
			panic(err)
		}
	}
	commit("pos/orders")
	commit("denied/orders")
	commit("pos/orders")
	fmt.Println("delivered:", <-delivered, <-delivered)

	b.Withhold()
	commit("pos/orders")
	fmt.Println("delivered, its acknowledgement withheld:", <-delivered)
	b.Cut()
	fmt.Println("delivered again after the cut:", <-delivered)

	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	dead, err := ob.List(ctx, outbox.ListOptions{State: outbox.StateDead})
	if err != nil {
		panic(err)
	}
	fmt.Printf("dead: seq %d, %q\n", dead[0].Seq, dead[0].LastError)
	// Output:
	// delivered: 1 3
	// delivered, its acknowledgement withheld: 4
	// delivered again after the cut: 4
	// dead: seq 2, "not authorized"
}
