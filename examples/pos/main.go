// Command pos is a point-of-sale terminal built on the outbox.
//
// Every sale is ONE SQLite transaction that writes the order row, the
// payment row and two events ("OrderPlaced" on stores/1/orders and
// "PaymentCaptured" on stores/1/payments). Every 7th card is declined: the
// transaction's function returns an error and everything it wrote — both
// rows and both events — rolls back, so no event of a sale that did not
// happen ever leaves the till. A relay publishes the committed events to an
// MQTT broker at QoS 1, in commit order.
//
// Without --broker, an MQTT broker is embedded on a free loopback port and
// the program subscribes to it itself, to check that exactly the committed
// events arrived: none missing, none from a declined sale.
//
//	go run ./examples/pos
//	go run ./examples/pos --orders 100 --rate 50
//	go run ./examples/pos --broker tcp://127.0.0.1:1883 --db /tmp/till.db
//
// It prints one summary line, e.g.
//
//	sales 20, declined 2, events committed 36, pending 0
//
// and exits non-zero on any error.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// drainTimeout bounds the wait for the relay to send everything at the end.
const drainTimeout = 30 * time.Second

// errDeclined is what the payment terminal answers for every 7th card.
var errDeclined = errors.New("card declined")

type config struct {
	db     string // SQLite file; empty = a file in a new temporary directory
	broker string // MQTT broker URL; empty = an embedded broker
	orders int
	rate   int
	source string
}

func main() {
	var cfg config
	flag.StringVar(&cfg.db, "db", "", "SQLite file (default: a file in a new temporary directory, removed at the end)")
	flag.StringVar(&cfg.broker, "broker", "", "MQTT broker URL, e.g. tcp://127.0.0.1:1883 (default: start an embedded broker)")
	flag.IntVar(&cfg.orders, "orders", 20, "sales to ring up")
	flag.IntVar(&cfg.rate, "rate", 20, "sales per second")
	flag.StringVar(&cfg.source, "source", "/stores/1/tills/1", "CloudEvents source naming this till")
	flag.Parse()
	if flag.NArg() > 0 || cfg.orders < 0 || cfg.rate <= 0 || cfg.source == "" {
		flag.Usage()
		os.Exit(2)
	}

	// The library's logs at Warn, to stderr.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := run(cfg, logger); err != nil {
		fmt.Fprintln(os.Stderr, "pos:", err)
		os.Exit(1)
	}
}

// OrderPlaced and PaymentCaptured are the events' payloads (CloudEvents
// "data"); the relay wraps them in the envelope.
type OrderPlaced struct {
	Order       int64 `json:"order"`
	AmountCents int64 `json:"amount_cents"`
}

type PaymentCaptured struct {
	Payment     int64 `json:"payment"`
	Order       int64 `json:"order"`
	AmountCents int64 `json:"amount_cents"`
}

func run(cfg config, logger *slog.Logger) error {
	// Ctrl-C (or SIGTERM) stops the till early, still cleaning up.
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	if cfg.db == "" {
		dir, err := os.MkdirTemp("", "outbox-pos")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cfg.db = filepath.Join(dir, "till.db")
	}

	// Without --broker: an embedded broker, with a subscriber inside it that
	// records what is delivered.
	var rec *recorder
	if cfg.broker == "" {
		rec = newRecorder()
		srv, err := startBroker(rec)
		if err != nil {
			return fmt.Errorf("embedded broker: %w", err)
		}
		// Closed last: after the relay has stopped (defers run in reverse).
		defer srv.Close()
		cfg.broker = srv.URL()
	}

	ob, err := outbox.Open(ctx, cfg.db, outbox.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer ob.Close() // idempotent; the happy path closes it explicitly below

	// The application's own tables live in the same SQLite file as the
	// outbox: that is what lets a sale and its events share a transaction.
	if _, err := ob.DB().ExecContext(ctx, `
		CREATE TABLE IF NOT EXISTS orders (
			id           INTEGER PRIMARY KEY,
			amount_cents INTEGER NOT NULL
		);
		CREATE TABLE IF NOT EXISTS payments (
			id           INTEGER PRIMARY KEY,
			order_id     INTEGER NOT NULL REFERENCES orders(id),
			amount_cents INTEGER NOT NULL
		)`); err != nil {
		return err
	}
	ordersBefore, err := countRows(ctx, ob.DB(), "orders")
	if err != nil {
		return err
	}

	// Events still pending from an earlier run of this till (with --db)
	// go out first; they are expected at the subscriber as well.
	expected := map[string]bool{}
	leftOver, err := pendingIDs(ctx, ob)
	if err != nil {
		return err
	}
	for _, id := range leftOver {
		expected[id] = true
	}
	if len(leftOver) > 0 {
		fmt.Printf("%d events left pending by an earlier run go out first\n", len(leftOver))
	}

	// The relay: one MQTT connection, QoS 1, commit order. It runs until
	// ctx is cancelled; the publisher never reconnects by itself, the relay
	// does (with backoff).
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{
		Broker:   cfg.broker,
		ClientID: "pos" + strings.ReplaceAll(cfg.source, "/", "-"), // unique per broker
	})
	if err != nil {
		return err
	}
	defer pub.Close() // idempotent as well
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{
		Source:    cfg.source,
		Reconnect: outbox.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second},
	})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()

	// Ring up the sales.
	tick := time.NewTicker(time.Second / time.Duration(cfg.rate))
	defer tick.Stop()
	var sales, declined, committedEvents int
	for i := 1; i <= cfg.orders; i++ {
		select {
		case <-tick.C:
		case <-ctx.Done():
			stopRelay()
			<-relayDone
			return fmt.Errorf("interrupted after %d sales", sales)
		}
		ids, err := sell(ctx, ob, int64(250+(i*137)%5000), i%7 == 0)
		sales++
		switch {
		case errors.Is(err, errDeclined):
			declined++ // rolled back: no rows, no events
		case err != nil:
			stopRelay()
			<-relayDone
			return fmt.Errorf("sale %d: %w", i, err)
		default:
			committedEvents += len(ids)
			for _, id := range ids {
				expected[id] = true
			}
		}
	}

	// Wait until the relay has sent everything. Pending counts rows not yet
	// acknowledged by the broker. With the embedded broker, also wait for
	// the subscriber: the broker sends its PUBACK before it hands the
	// message to subscribers, so the last events may reach the subscriber
	// just after Pending drops to 0.
	var st outbox.Stats
	deadline := time.Now().Add(drainTimeout)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		st, err = ob.Stats(ctx)
		if err != nil {
			st.Pending = -1 // unknown
			break
		}
		if st.Pending == 0 && (rec == nil || rec.hasAll(expected)) {
			break
		}
		if time.Now().After(deadline) {
			err = fmt.Errorf("still %d events pending after %s (broker %s unreachable?)", st.Pending, drainTimeout, cfg.broker)
			break
		}
		<-poll.C
	}

	// Clean shutdown: stop the relay and wait for Run to return (it waits,
	// bounded, for in-flight acknowledgements and releases its lease), then
	// close the publisher and the outbox.
	stopRelay()
	if runErr := <-relayDone; runErr != nil {
		err = errors.Join(err, fmt.Errorf("relay: %w", runErr))
	}
	if closeErr := pub.Close(); closeErr != nil {
		err = errors.Join(err, closeErr)
	}
	fmt.Printf("sales %d, declined %d, events committed %d, pending %d\n", sales, declined, committedEvents, st.Pending)
	if err != nil {
		return err
	}

	// The declined sales left no rows behind either.
	ordersAfter, err := countRows(ctx, ob.DB(), "orders")
	if err != nil {
		return err
	}
	if got, want := ordersAfter-ordersBefore, sales-declined; got != want {
		return fmt.Errorf("%d orders stored, want %d", got, want)
	}
	if err := ob.Close(); err != nil {
		return err
	}

	if st.Dead > 0 {
		return fmt.Errorf("%d events are dead (see ob.List with StateDead)", st.Dead)
	}
	if rec == nil {
		return nil
	}

	// Exactly the committed events arrived: every one, and nothing else
	// (an event of a declined sale would be an id not in expected).
	unique, dups, missing, unexpected, malformed := rec.compare(expected)
	fmt.Printf("delivered %d unique (%d duplicates)\n", unique, dups)
	if missing > 0 || unexpected > 0 || malformed > 0 || unique != len(expected) {
		return fmt.Errorf("delivery check failed: %d expected, %d delivered, %d missing, %d unexpected, %d malformed",
			len(expected), unique, missing, unexpected, malformed)
	}
	return nil
}

// sell rings up one sale: the order, its payment and their two events in
// ONE transaction. When the card is declined, the function returns an error
// after everything was written, and Transact rolls all of it back. It
// returns the ids of the committed events.
func sell(ctx context.Context, ob *outbox.Outbox, amount int64, declineCard bool) ([]string, error) {
	var ids []string
	err := ob.Transact(ctx, func(tx *sql.Tx) error {
		// Transact may run this function again if SQLite reports the
		// database busy, so it only touches tx and resets its own results.
		ids = nil
		res, err := tx.ExecContext(ctx, `INSERT INTO orders (amount_cents) VALUES (?)`, amount)
		if err != nil {
			return err
		}
		orderID, err := res.LastInsertId()
		if err != nil {
			return err
		}
		res, err = tx.ExecContext(ctx, `INSERT INTO payments (order_id, amount_cents) VALUES (?, ?)`, orderID, amount)
		if err != nil {
			return err
		}
		paymentID, err := res.LastInsertId()
		if err != nil {
			return err
		}

		order, err := json.Marshal(OrderPlaced{Order: orderID, AmountCents: amount})
		if err != nil {
			return err
		}
		payment, err := json.Marshal(PaymentCaptured{Payment: paymentID, Order: orderID, AmountCents: amount})
		if err != nil {
			return err
		}
		// The ids are set here (instead of left for Enqueue to make) only
		// so that this program can check them at the subscriber.
		msgs := []outbox.Message{
			{ID: outbox.NewID(), Topic: "stores/1/orders", Type: "com.example.pos.OrderPlaced", Payload: order},
			{ID: outbox.NewID(), Topic: "stores/1/payments", Type: "com.example.pos.PaymentCaptured", Payload: payment},
		}
		if err := ob.Enqueue(ctx, tx, msgs...); err != nil {
			return err // e.g. outbox.ErrFull: the sale rolls back with it
		}
		if declineCard {
			return errDeclined // rolls back both rows and both events
		}
		for _, m := range msgs {
			ids = append(ids, m.ID)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// pendingIDs lists the ids of the events waiting in the outbox.
func pendingIDs(ctx context.Context, ob *outbox.Outbox) ([]string, error) {
	var ids []string
	var after int64
	for {
		recs, err := ob.List(ctx, outbox.ListOptions{State: outbox.StatePending, AfterSeq: after, Limit: 1000})
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			ids = append(ids, r.ID)
			after = r.Seq
		}
		if len(recs) < 1000 {
			return ids, nil
		}
	}
}

func countRows(ctx context.Context, db *sql.DB, table string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&n)
	return n, err
}

// startBroker starts an embedded MQTT broker (mochi, in this process, the
// one the repository's tests use) on a free loopback port, with an inline
// subscription to stores/# that feeds rec.
func startBroker(rec *recorder) (*harness.Mochi, error) {
	srv, err := harness.LaunchMochi(harness.MochiOptions{})
	if err != nil {
		return nil, err
	}
	if err := srv.Subscribe("stores/#", func(m harness.Message) { rec.receive(m.Payload) }); err != nil {
		srv.Close()
		return nil, err
	}
	return srv, nil
}

// recorder is the embedded broker's subscriber: it records each delivered
// event once by id (delivery is at least once, so a redelivery after a lost
// connection is possible and is counted as a duplicate).
type recorder struct {
	mu        sync.Mutex
	seen      map[string]bool
	dups      int
	malformed int
}

func newRecorder() *recorder { return &recorder{seen: map[string]bool{}} }

func (r *recorder) receive(payload []byte) {
	ev, err := outbox.DecodeEvent(payload)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err != nil:
		r.malformed++
	case r.seen[ev.ID]:
		r.dups++
	default:
		r.seen[ev.ID] = true
	}
}

// hasAll reports whether every expected id was delivered.
func (r *recorder) hasAll(expected map[string]bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range expected {
		if !r.seen[id] {
			return false
		}
	}
	return true
}

// compare counts the delivered events against the expected ids.
func (r *recorder) compare(expected map[string]bool) (unique, dups, missing, unexpected, malformed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range expected {
		if !r.seen[id] {
			missing++
		}
	}
	for id := range r.seen {
		if !expected[id] {
			unexpected++
		}
	}
	return len(r.seen), r.dups, missing, unexpected, r.malformed
}
