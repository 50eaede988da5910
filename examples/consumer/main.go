// Command consumer is the backend side of the outbox: it receives the events
// relayed from the tills with an consumer.Subscriber and applies each one ONCE
// to its own SQLite database through an consumer.Inbox.
//
// Delivery from the outbox is at least once. The Inbox records each event's
// (source, id) — the CloudEvents identity — in the same transaction as the
// handler's writes (here a row in the table orders_seen), so a redelivery
// is recognised and skipped even across crashes and restarts, as long as
// the consumer keeps its database (--db). The Subscriber acknowledges a
// message only after that transaction committed; a message that is not an
// event is quarantined in the database and counted as malformed, never
// allowed to block the consumer. Batched and compressed messages (a relay
// with RelayOptions.Batch or Compress; docs/batching.md) need no flag:
// the Subscriber applies each of their events once, in order, and
// acknowledges the message after the last.
//
// Events arrive in commit order while the connection holds, but a broker
// may resend a stored session's messages in another order (mochi, the
// embedded broker used here, does). The "seq" printed for each event is
// the commit order within its source: a consumer that needs order sorts or
// checks by it, not by arrival.
//
//	go run ./examples/consumer --demo --count 3
//	go run ./examples/consumer --broker tcp://127.0.0.1:1883 --topic 'stores/#' --db /tmp/backend.db
//
// With --demo it starts an embedded broker and publishes a few events to it
// itself (one of them twice, plus one message that is not JSON), so it runs
// standalone. It prints one line per applied event and, on exit (after
// --count events applied, or on SIGINT/SIGTERM), a summary:
//
//	applied 3, duplicates 1, malformed 1
//
// The library logs (a quarantined message, a lost connection) go to stderr.
//
// # PostgreSQL, and several consumers
//
// With --postgres DSN the database is PostgreSQL (opened with the pgx
// stdlib driver, which this program imports and the library does not)
// instead of a SQLite file, and several consumers may share it: the Inbox
// applies each event once between them. There are two ways to spread the
// events over them:
//
//   - A shared subscription, --share GROUP: every consumer subscribes to
//     $share/GROUP/<topic> and the broker hands each message to one member
//     of the group. Any number of consumers, nothing to configure per
//     consumer but its client id. It gives up order: two events of one
//     till may go to two consumers and be applied in either order. And
//     each consumer's session is persistent, so the broker gives it its
//     share even while it is away: a consumer that is away (killed, or
//     stopped) holds its share back until it returns, nothing lost; one
//     removed for good must be retired (docs/consumer.md, "Shared
//     subscriptions: a member that goes away").
//
//   - Partitioning by topic, --topics given per consumer: each consumer
//     subscribes to its own tills' topics (stores/1/#,stores/2/# to one,
//     stores/3/# to another). Each till's events reach one consumer, in
//     the order the till committed them; the price is that the partition
//     is configuration, and a consumer that is away holds its tills back.
//
//     go run ./examples/consumer --broker tcp://127.0.0.1:1883 --postgres postgres://app@db/backend --share backend --client-id consumer-pg-1
//     go run ./examples/consumer --broker tcp://127.0.0.1:1883 --postgres postgres://app@db/backend --topics 'stores/1/#,stores/2/#' --client-id consumer-pg-a
//
// On PostgreSQL orders_seen also records which consumer applied the event,
// and each consumer prints only its own.
//
// # NATS JetStream
//
// With --nats URL (a cluster's nodes comma-separated) instead of --broker,
// the consumer is a member of a JetStream durable pull consumer (--durable,
// on --stream, which must exist; the first member creates the durable
// consumer with --ack-wait): any number of members, each message applied by
// one, and what a member that dies held goes to the others after the ack
// wait. Order across members is not kept, as with --share.
//
//	go run ./examples/consumer --nats nats://127.0.0.1:4222 --stream EVENTS --durable backend --postgres postgres://app@db/backend --client-id consumer-js-1
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

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/consumer"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// sqliteClientID is the client id of a consumer on its own SQLite file,
// unless --client-id says otherwise: not one a PostgreSQL consumer of the
// README's commands uses.
const sqliteClientID = "consumer-sqlite"

type config struct {
	db       string // SQLite file; empty = a file in a new temporary directory
	postgres string // PostgreSQL DSN; set, it is used instead of db
	broker   string
	topic    string
	topics   string // comma-separated filters; set, they replace topic
	share    string // shared subscription group; empty = none
	clientID string
	count    int
	demo     bool
	nats     string        // NATS URLs, comma-separated; set, JetStream instead of MQTT
	stream   string        // the JetStream stream
	durable  string        // the durable pull consumer's name
	ackWait  time.Duration // the durable consumer's AckWait, when this member creates it
}

func main() {
	var cfg config
	flag.StringVar(&cfg.db, "db", "", "SQLite file of this consumer (default: a file in a new temporary directory, removed at the end)")
	flag.StringVar(&cfg.broker, "broker", "", "MQTT broker URL, e.g. tcp://127.0.0.1:1883, or a cluster's nodes comma-separated (required unless --demo)")
	flag.StringVar(&cfg.postgres, "postgres", "", "PostgreSQL DSN (e.g. postgres://user@host/db): the consumer's database there instead of a SQLite file; several consumers may share it")
	flag.StringVar(&cfg.topic, "topic", "stores/#", "MQTT topic filter to subscribe to")
	flag.StringVar(&cfg.topics, "topics", "", "comma-separated topic filters, instead of --topic: this consumer's partition of the tills (keeps each till's order)")
	flag.StringVar(&cfg.share, "share", "", "shared subscription group: subscribe to $share/GROUP/<filter>, so that the group's consumers split the events (gives up each till's order)")
	flag.StringVar(&cfg.clientID, "client-id", "", "MQTT client id, one per consumer; keep it fixed so the broker keeps this consumer's session (default "+sqliteClientID+" on SQLite; required with --postgres)")
	flag.IntVar(&cfg.count, "count", 0, "exit after this many events applied (0 = run until SIGINT/SIGTERM)")
	flag.BoolVar(&cfg.demo, "demo", false, "start an embedded broker and publish a few demo events to it")
	flag.StringVar(&cfg.nats, "nats", "", "NATS URL, e.g. nats://127.0.0.1:4222, or a cluster's nodes comma-separated: consume from JetStream instead of MQTT")
	flag.StringVar(&cfg.stream, "stream", "EVENTS", "with --nats: the JetStream stream (it must exist)")
	flag.StringVar(&cfg.durable, "durable", "backend", "with --nats: the durable pull consumer the members share (created if absent)")
	flag.DurationVar(&cfg.ackWait, "ack-wait", 30*time.Second, "with --nats: the durable consumer's ack wait, if this member creates it: how long a dead member's messages wait for the others")
	flag.Parse()
	sources := 0
	for _, set := range []bool{cfg.broker != "", cfg.demo, cfg.nats != ""} {
		if set {
			sources++
		}
	}
	if flag.NArg() > 0 || cfg.count < 0 || cfg.topic == "" || sources != 1 || (cfg.db != "" && cfg.postgres != "") {
		fmt.Fprintln(os.Stderr, "consumer: give one of --broker URL, --nats URL and --demo, and at most one of --db and --postgres")
		flag.Usage()
		os.Exit(2)
	}
	// One id per role: a broker keeps one session per client id, so two
	// consumers under one id take each other's subscriptions and events.
	// Consumers sharing PostgreSQL are several: each names itself.
	if cfg.clientID == "" {
		if cfg.postgres != "" {
			fmt.Fprintln(os.Stderr, "consumer: with --postgres give each consumer its own --client-id (e.g. consumer-pg-1, consumer-pg-2)")
			os.Exit(2)
		}
		cfg.clientID = sqliteClientID
	}
	if cfg.demo && cfg.count > len(demoEvents) {
		fmt.Fprintf(os.Stderr, "consumer: --demo publishes %d unique events; --count %d would never be reached\n", len(demoEvents), cfg.count)
		os.Exit(2)
	}

	// SIGINT or SIGTERM ends the run cleanly, with the summary.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The library's logs at Warn, to stderr.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := run(ctx, cfg, logger); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// filters are the topic filters to subscribe to: --topics or --topic, in
// the shared subscription's form with --share.
func (cfg config) filters() []string {
	fs := []string{cfg.topic}
	if cfg.topics != "" {
		fs = strings.Split(cfg.topics, ",")
	}
	if cfg.share != "" {
		for i, f := range fs {
			fs[i] = "$share/" + cfg.share + "/" + f
		}
	}
	return fs
}

func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	if cfg.db == "" && cfg.postgres == "" {
		dir, err := os.MkdirTemp("", "outbox-consumer")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir) // runs last: after the database is closed
		cfg.db = filepath.Join(dir, "consumer.db")
	}
	var srv *harness.Mochi
	if cfg.demo {
		// An embedded MQTT broker (mochi, in this process, the one the
		// repository's tests use) on a free loopback port; its inline
		// client publishes the demo events.
		var err error
		srv, err = harness.LaunchMochi(harness.MochiOptions{})
		if err != nil {
			return fmt.Errorf("embedded broker: %w", err)
		}
		defer srv.Close()
		cfg.broker = srv.URL()
	}

	// The consumer's own database: its business table and, beside it, the
	// inbox's tables, so that both are written in one transaction.
	st, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	db := st.db
	defer db.Close()
	in, err := consumer.NewInbox(ctx, db, consumer.InboxOptions{Logger: logger})
	if err != nil {
		return err
	}

	// apply is the handler: it runs inside the Inbox's transaction and must
	// have no effect outside it, because it runs again if the transaction
	// fails (SQLite busy, a failed commit, an error) and a duplicate never
	// reaches it. That is why it does not print: the lines are printed by
	// report, from the committed rows.
	var stats func() progress
	apply := func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
		// Events are applied one at a time, so Applied counts exactly the
		// events committed before this one. Once --count is reached, hold
		// this one until shutdown: it rolls back, stays unacknowledged and
		// is delivered again next time.
		if cfg.count > 0 && stats().applied >= int64(cfg.count) {
			<-ctx.Done()
			return ctx.Err()
		}
		return st.record(ctx, tx, ev)
	}
	var sub interface{ Run(context.Context) error }
	where := cfg.filters()
	if cfg.nats != "" {
		js, err := consumer.NewJetStreamConsumer(in, apply, consumer.JetStreamConsumerOptions{
			Servers: strings.Split(cfg.nats, ","), Stream: cfg.stream, Durable: cfg.durable, AckWait: cfg.ackWait, Logger: logger,
		})
		if err != nil {
			return err
		}
		sub, where, cfg.broker = js, []string{cfg.stream + "/" + cfg.durable}, cfg.nats
		stats = func() progress {
			st := js.Stats()
			return progress{st.Connected, st.Applied, st.Duplicates, st.Quarantined}
		}
	} else {
		mq, err := consumer.NewSubscriber(in, apply, consumer.SubscriberOptions{
			// Several addresses (a cluster's nodes), comma-separated: the
			// Subscriber moves to the next one when a connection fails.
			Brokers: strings.Split(cfg.broker, ","),
			// A fixed client id gives a persistent session: the broker keeps
			// the subscription and the QoS 1 messages published while this
			// consumer is away, and delivers them when it connects again.
			ClientID: cfg.clientID,
			Topics:   cfg.filters(),
			Logger:   logger,
		})
		if err != nil {
			return err
		}
		sub = mq
		stats = func() progress {
			st := mq.Stats()
			return progress{st.Connected, st.Applied, st.Duplicates, st.Quarantined}
		}
	}
	rep, err := newReporter(ctx, st)
	if err != nil {
		return err
	}

	// The subscriber runs (and reconnects, for as long as it takes) until
	// subCtx ends; stop ends it and waits for it, once.
	subCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sub.Run(subCtx) // returns when subCtx ends
	}()
	stop := sync.OnceFunc(func() { cancel(); <-done })
	defer stop()
	fmt.Fprintf(os.Stderr, "consumer: connecting to %s as %s\n", cfg.broker, cfg.clientID)

	// Watch the subscriber: say when it is subscribed (the demo publishes
	// then), print what was applied, stop after --count.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	connected, published := false, false
	for ctx.Err() == nil {
		st := stats()
		if st.connected && !connected {
			fmt.Printf("subscribed to %s at %s as %s\n", strings.Join(where, ","), cfg.broker, cfg.clientID)
			if cfg.demo && !published {
				if err := publishDemo(srv); err != nil {
					return err
				}
				published = true
			}
		}
		connected = st.connected
		if err := rep.print(ctx); err != nil {
			return err
		}
		if cfg.count > 0 && st.applied >= int64(cfg.count) {
			break
		}
		select {
		case <-ctx.Done(): // SIGINT or SIGTERM
		case <-tick.C:
		}
	}
	stop()
	// What committed since the last look; ctx may have ended (a signal).
	if err := rep.print(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	final := stats()
	fmt.Printf("applied %d, duplicates %d, malformed %d\n", final.applied, final.duplicates, final.quarantined)
	return nil
}

// progress is what the consumer did, from either kind's Stats.
type progress struct {
	connected                        bool
	applied, duplicates, quarantined int64
}

// store is the consumer's database and how its handler writes there.
type store struct {
	db       *sql.DB
	postgres bool
	clientID string
}

// openStore opens the SQLite file or the PostgreSQL database and creates
// orders_seen. On PostgreSQL several consumers share the table: each row
// says which consumer applied it, and n numbers the rows.
func openStore(ctx context.Context, cfg config) (*store, error) {
	if cfg.postgres == "" {
		db, err := outbox.OpenDB(cfg.db, outbox.DBOptions{})
		if err != nil {
			return nil, err
		}
		_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders_seen (
			source TEXT    NOT NULL,
			id     TEXT    NOT NULL,
			seq    INTEGER NOT NULL,
			type   TEXT    NOT NULL,
			data   BLOB
		)`)
		if err != nil {
			db.Close()
			return nil, err
		}
		return &store{db: db, clientID: cfg.clientID}, nil
	}
	db, err := sql.Open("pgx", cfg.postgres)
	if err != nil {
		return nil, err
	}
	// Consumers starting at once would fail on each other's CREATE TABLE
	// IF NOT EXISTS; the advisory lock makes them take turns.
	err = func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('examples/consumer'))`); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders_seen (
			n        BIGSERIAL PRIMARY KEY,
			consumer TEXT   NOT NULL,
			source   TEXT   NOT NULL,
			id       TEXT   NOT NULL,
			seq      BIGINT NOT NULL,
			type     TEXT   NOT NULL,
			data     BYTEA
		)`); err != nil {
			return err
		}
		return tx.Commit()
	}()
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return &store{db: db, postgres: true, clientID: cfg.clientID}, nil
}

// record is the handler's write, in the Inbox's transaction.
func (s *store) record(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
	var err error
	if s.postgres {
		_, err = tx.ExecContext(ctx, `INSERT INTO orders_seen (consumer, source, id, seq, type, data) VALUES ($1, $2, $3, $4, $5, $6)`,
			s.clientID, ev.Source, ev.ID, ev.Sequence, ev.Type, ev.Data)
	} else {
		_, err = tx.ExecContext(ctx, `INSERT INTO orders_seen (source, id, seq, type, data) VALUES (?, ?, ?, ?, ?)`,
			ev.Source, ev.ID, ev.Sequence, ev.Type, ev.Data)
	}
	return err
}

// reporter prints the rows of orders_seen this consumer committed since it
// last looked: each applied event exactly once, and never one whose
// transaction failed. This consumer applies one event at a time, so its
// rows commit one after another, each numbered (SQLite's rowid, or n on
// PostgreSQL) above the ones before: number order is its commit order.
type reporter struct {
	st   *store
	last int64 // number of the last row printed
}

// newReporter starts after the rows of earlier runs (with --db or
// --postgres).
func newReporter(ctx context.Context, st *store) (*reporter, error) {
	r := &reporter{st: st}
	var err error
	if st.postgres {
		err = st.db.QueryRowContext(ctx, `SELECT coalesce(max(n), 0) FROM orders_seen WHERE consumer = $1`, st.clientID).Scan(&r.last)
	} else {
		err = st.db.QueryRowContext(ctx, `SELECT coalesce(max(rowid), 0) FROM orders_seen`).Scan(&r.last)
	}
	return r, err
}

func (r *reporter) print(ctx context.Context) error {
	var rows *sql.Rows
	var err error
	if r.st.postgres {
		rows, err = r.st.db.QueryContext(ctx, `SELECT n, source, id, seq, type FROM orders_seen WHERE consumer = $1 AND n > $2 ORDER BY n`, r.st.clientID, r.last)
	} else {
		rows, err = r.st.db.QueryContext(ctx, `SELECT rowid, source, id, seq, type FROM orders_seen WHERE rowid > ? ORDER BY rowid`, r.last)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var source, id, typ string
		var seq int64
		if err := rows.Scan(&r.last, &source, &id, &seq, &typ); err != nil {
			return err
		}
		fmt.Printf("applied source=%s id=%s seq=%d type=%s\n", source, id, seq, typ)
	}
	return rows.Err()
}

// cloudEvent is the structured-mode CloudEvents JSON document that the
// outbox relay publishes (see docs/envelope.md).
type cloudEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Time            time.Time       `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Sequence        string          `json:"sequence"` // zero-padded to 20 digits
	Data            json.RawMessage `json:"data"`
}

// demoEvents are what --demo publishes, as two tills' relays would. The
// third has the same id as the first but another source: a different event.
var demoEvents = func() []cloudEvent {
	id1, id2 := outbox.NewID(), outbox.NewID()
	now := time.Now().UTC()
	ev := func(source, id string, seq int, typ, data string) cloudEvent {
		return cloudEvent{
			SpecVersion: "1.0", ID: id, Source: source, Type: typ, Time: now,
			DataContentType: "application/json", Sequence: fmt.Sprintf("%020d", seq), Data: json.RawMessage(data),
		}
	}
	return []cloudEvent{
		ev("/stores/1/tills/1", id1, 1, "com.example.pos.OrderPlaced", `{"order":1,"amount_cents":1250}`),
		ev("/stores/1/tills/1", id2, 2, "com.example.pos.PaymentCaptured", `{"payment":1,"order":1,"amount_cents":1250}`),
		ev("/stores/1/tills/2", id1, 1, "com.example.pos.OrderPlaced", `{"order":1,"amount_cents":990}`),
	}
}()

// publishDemo publishes the demo events through the broker's inline client:
// the first, the second, the first AGAIN (as after a relay's reconnect), a
// message that is not JSON, then the third. Each --demo run expects
// "applied 3, duplicates 1, malformed 1" with --count 3 (the third applied
// event is the last message).
func publishDemo(srv *harness.Mochi) error {
	docs := make([][]byte, len(demoEvents))
	for i, ev := range demoEvents {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		docs[i] = b
	}
	msgs := []struct {
		topic   string
		payload []byte
	}{
		{"stores/1/orders", docs[0]},
		{"stores/1/payments", docs[1]},
		{"stores/1/orders", docs[0]}, // a redelivery: same source and id
		{"stores/1/orders", []byte("not json at all")},
		{"stores/1/orders", docs[2]},
	}
	for _, m := range msgs {
		if err := srv.Server().Publish(m.topic, m.payload, false, 1); err != nil {
			return errors.Join(fmt.Errorf("publish demo message to %s", m.topic), err)
		}
	}
	return nil
}
