// Command quickstart shows the outbox doing its job with nothing to set up:
// an embedded MQTT broker on loopback, a simulated till that commits orders
// and their events into a SQLite file in a temporary directory, the relay,
// and a subscriber that dedupes by event id. Midway the broker goes away for
// a while and comes back. It ends with a summary and exits non-zero if an
// event was lost or came out of order.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgeoutbox/outbox"
)

func main() {
	orders := flag.Int("orders", 500, "orders to commit")
	rate := flag.Int("rate", 100, "orders per second")
	outage := flag.Duration("outage", 2*time.Second, "how long the broker is away")
	flag.Parse()
	if err := run(*orders, *rate, *outage); err != nil {
		log.Fatal(err)
	}
}

// subscriber records what the broker delivers, once per event id.
type subscriber struct {
	mu       sync.Mutex
	seen     map[string]bool
	lastSeq  int64
	unique   int
	dups     int
	disorder int
}

func (s *subscriber) receive(payload []byte) {
	ev, err := outbox.DecodeEvent(payload)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[ev.ID] {
		s.dups++ // at-least-once: a redelivery after a cut, skipped
		return
	}
	s.seen[ev.ID] = true
	s.unique++
	if ev.Sequence <= s.lastSeq {
		s.disorder++
	}
	s.lastSeq = ev.Sequence
}

func (s *subscriber) counts() (unique, dups, disorder int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unique, s.dups, s.disorder
}

// startBroker starts an embedded broker on addr with the subscriber inside.
func startBroker(addr string, sub *subscriber) (*mochi.Server, error) {
	srv := mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return nil, err
	}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: addr})); err != nil {
		return nil, err
	}
	if err := srv.Subscribe("stores/#", 1, func(_ *mochi.Client, _ packets.Subscription, pk packets.Packet) {
		sub.receive(pk.Payload)
	}); err != nil {
		return nil, err
	}
	return srv, srv.Serve()
}

func run(orders, rate int, outage time.Duration) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "outbox-quickstart")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// A free loopback port, kept across the broker's restart.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	sub := &subscriber{seen: map[string]bool{}}
	first, err := startBroker(addr, sub)
	if err != nil {
		return err
	}
	var brokerMu sync.Mutex // the broker is replaced when it comes back
	broker := first

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	path := filepath.Join(dir, "till.db")
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer ob.Close()
	if _, err := ob.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, total_cents INTEGER NOT NULL)`); err != nil {
		return err
	}
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: "tcp://" + addr, ClientID: "till-1"})
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{
		Source:    "/stores/1/tills/1",
		Reconnect: outbox.Backoff{Initial: 100 * time.Millisecond, Max: time.Second},
	})
	if err != nil {
		return err
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()

	fmt.Printf("database %s, broker %s: committing %d orders at %d/s\n", path, addr, orders, rate)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var committed, rolledBack int
	for i := 1; i <= orders; i++ {
		<-tick.C
		if i == orders/3 {
			fmt.Printf("broker down for %s (the till keeps selling)\n", outage)
			brokerMu.Lock()
			broker.Close()
			brokerMu.Unlock()
			time.AfterFunc(outage, func() {
				b, err := startBroker(addr, sub)
				if err != nil {
					log.Printf("restarting the broker: %v", err)
					return
				}
				brokerMu.Lock()
				broker = b
				brokerMu.Unlock()
				fmt.Println("broker back")
			})
		}
		declined := i%10 == 0 // every tenth card is declined: the order rolls back
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			res, err := tx.Exec(`INSERT INTO orders (total_cents) VALUES (?)`, 100*i)
			if err != nil {
				return err
			}
			id, _ := res.LastInsertId()
			if err := ob.Enqueue(ctx, tx, outbox.Message{
				Topic:   "stores/1/orders",
				Type:    "com.example.order.created",
				Payload: fmt.Appendf(nil, `{"order":%d,"total_cents":%d}`, id, 100*i),
			}); err != nil {
				return err
			}
			if declined {
				return fmt.Errorf("card declined")
			}
			return nil
		})
		if declined {
			rolledBack++
		} else if err != nil {
			return err
		} else {
			committed++
		}
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		unique, _, _ := sub.counts()
		if unique >= committed || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-relayDone; err != nil {
		return err
	}
	brokerMu.Lock()
	broker.Close()
	brokerMu.Unlock()

	unique, dups, disorder := sub.counts()
	lost := committed - unique
	fmt.Printf("committed %d, rolled back %d, delivered %d unique, %d duplicates, %d lost, %d out of order\n",
		committed, rolledBack, unique, dups, lost, disorder)
	if lost != 0 || disorder != 0 || unique > committed {
		return fmt.Errorf("FAILED: promises broken")
	}
	fmt.Println("OK: every committed order's event delivered, none of the rolled-back ones, in commit order")
	return nil
}
