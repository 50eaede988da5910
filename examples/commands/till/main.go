// Command till is the device side of the commands example: it receives
// price changes from the backend (examples/commands/backend) over MQTT and
// applies each to its own prices table exactly once, in one SQLite
// transaction with its answer, which its relay then publishes to the
// command's Response Topic with its Correlation Data.
//
// Three parts run side by side on one database:
//
//   - the MQTT command receiver (NewMQTTCommandReceiver): a persistent
//     session of its own on the till's command topic; it stores each
//     command (deduplicated by source and id) and acknowledges it to the
//     broker only once that is durable;
//   - Commands (NewCommands): applies the stored commands in arrival order,
//     each in one transaction: the handler's writes, the command marked
//     applied, its answer enqueued; a stale command is answered "expired"
//     and never handed to the handler;
//   - the relay: publishes the answers (and any other event) at QoS 1.
//
// Run it before the backend (the broker keeps commands for the receiver's
// session once it has subscribed):
//
//	go run ./examples/commands/till --broker tcp://127.0.0.1:1883 --db /tmp/till.db
//
// It prints "listening on tills/1/commands", then a line per command
// once its outcome is committed ("applied command=… type=…"); with --count
// N it exits once N commands are settled and their answers published, and
// prints its prices ("price item=coffee price_cents=200 command=…").
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/edgeoutbox/outbox"
)

func main() {
	log.SetFlags(0)
	if err := run(); err != nil {
		log.Fatalf("till: %v", err)
	}
}

// priceChange is a command's data.
type priceChange struct {
	Item       string `json:"item"`
	PriceCents int    `json:"price_cents"`
}

// applied is the handler's result, which the answer carries.
type applied struct {
	Item     string `json:"item"`
	OldCents *int   `json:"old_price_cents"` // null: a new item
	NewCents int    `json:"price_cents"`
}

func run() error {
	broker := flag.String("broker", "tcp://127.0.0.1:1883", "the MQTT broker")
	dbPath := flag.String("db", "", "the till's database (default: a temporary file)")
	till := flag.String("till", "1", "this till's number: its command topic is tills/<n>/commands, its client ids till-<n>-…")
	count := flag.Int("count", 0, "exit once this many commands are settled and answered (0: run until Ctrl-C)")
	flag.Parse()
	topic := "tills/" + *till + "/commands"
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	if *dbPath == "" {
		dir, err := os.MkdirTemp("", "till-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		*dbPath = filepath.Join(dir, "till.db")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ob, err := outbox.Open(ctx, *dbPath, outbox.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer ob.Close()
	// The application's own tables: the current price of each item, and
	// the history of its changes, a row per command applied.
	if _, err := ob.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS prices (
		item TEXT PRIMARY KEY, price_cents INTEGER NOT NULL, command_id TEXT NOT NULL);
		CREATE TABLE IF NOT EXISTS price_history (id INTEGER PRIMARY KEY, command_id TEXT NOT NULL,
		item TEXT NOT NULL, old_price_cents INTEGER, price_cents INTEGER NOT NULL)`); err != nil {
		return err
	}

	// The handler runs inside the command's transaction: its writes, the
	// command marked applied and the answer commit together or not at
	// all. It may run more than once for one command (a crash before the
	// commit), so it prints nothing: what happened is read from the
	// committed rows below.
	handler := func(ctx context.Context, tx *sql.Tx, cmd outbox.Command) ([]byte, error) {
		var p priceChange
		if err := json.Unmarshal(cmd.Data, &p); err != nil || p.Item == "" || p.PriceCents < 0 {
			return nil, fmt.Errorf("not a price change: %s", cmd.Data)
		}
		res := applied{Item: p.Item, NewCents: p.PriceCents}
		var old int
		switch err := tx.QueryRowContext(ctx, `SELECT price_cents FROM prices WHERE item = ?`, p.Item).Scan(&old); {
		case err == nil:
			res.OldCents = &old
		case !errors.Is(err, sql.ErrNoRows):
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO prices (item, price_cents, command_id) VALUES (?, ?, ?)
			ON CONFLICT (item) DO UPDATE SET price_cents = excluded.price_cents, command_id = excluded.command_id`,
			p.Item, p.PriceCents, cmd.ID); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO price_history (command_id, item, old_price_cents, price_cents) VALUES (?, ?, ?, ?)`,
			cmd.ID, p.Item, res.OldCents, p.PriceCents); err != nil {
			return nil, err
		}
		return json.Marshal(res)
	}

	var mu sync.Mutex
	settled := 0
	enough := make(chan struct{})
	cmds, err := ob.NewCommands(handler, outbox.CommandOptions{
		Logger: logger,
		// Called once the outcome is committed.
		OnCommand: func(cmd outbox.Command, outcome outbox.CommandOutcome, err error) {
			if outcome == outbox.CommandRetry {
				log.Printf("till: command %s failed, will retry: %v", cmd.ID, err)
				return
			}
			fmt.Printf("%s command=%s type=%s\n", outcome, cmd.ID, cmd.Type)
			mu.Lock()
			defer mu.Unlock()
			if settled++; settled == *count {
				close(enough)
			}
		},
	})
	if err != nil {
		return err
	}
	recv, err := ob.NewMQTTCommandReceiver(outbox.MQTTCommandOptions{Broker: *broker, ClientID: "till-" + *till + "-commands",
		Topics: []string{topic}, Logger: logger})
	if err != nil {
		return err
	}
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: *broker, ClientID: "till-" + *till + "-relay", Logger: logger})
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{Source: "/tills/" + *till})
	if err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 3)
	for _, r := range []interface{ Run(context.Context) error }{cmds, recv, relay} {
		go func() { errs <- r.Run(runCtx) }()
	}
	// Listening once subscribed: the broker keeps the commands for the
	// receiver's session from then on, while the till is away too.
	for !recv.Stats().Connected {
		select {
		case <-time.After(20 * time.Millisecond):
		case err := <-errs:
			return fmt.Errorf("before subscribing: %w", err)
		case <-ctx.Done():
			return nil
		}
	}
	fmt.Printf("listening on %s\n", topic)

	var done <-chan struct{} = enough
	if *count == 0 {
		done = nil
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
	case <-done:
		runErr = drained(ctx, ob)
	}
	cancel()
	for range 3 {
		if err := <-errs; runErr == nil && err != nil && !errors.Is(err, context.Canceled) {
			runErr = err
		}
	}
	if runErr != nil {
		return runErr
	}
	return printPrices(ob.DB())
}

// drained waits until nothing is pending (every answer published), or
// ctx ends.
func drained(ctx context.Context, ob *outbox.Outbox) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := ob.Stats(ctx)
		if err != nil || st.Pending == 0 {
			return err
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// printPrices prints the prices table as the commands left it.
func printPrices(db *sql.DB) error {
	rows, err := db.Query(`SELECT item, price_cents, command_id FROM prices ORDER BY item`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var item, id string
		var cents int
		if err := rows.Scan(&item, &cents, &id); err != nil {
			return err
		}
		fmt.Printf("price item=%s price_cents=%d command=%s\n", item, cents, id)
	}
	return rows.Err()
}
