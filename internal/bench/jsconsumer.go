package bench

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the PostgreSQL driver the Inbox knows
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/consumer"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// jsConsumerStream holds the events the consumers apply, published once.
const jsConsumerStream = "ORDERS"

// jsMembers are the member counts of the durable consumer measured.
var jsMembers = []int{1, 2, 4}

// jsCPUNames are the programs whose CPU time section 11 reports, beside
// this process (the consumers, and their PostgreSQL driver).
var jsCPUNames = []struct{ key, comm string }{{"postgres", "postgres"}, {"nats", "nats-server"}}

// jsConsumers measures members of one durable pull consumer applying the
// events of a stream on the server at url into one PostgreSQL inbox.
func (r *runner) jsConsumers(ctx context.Context, url string) error {
	tb := newSectionTB(r.dir)
	defer tb.close()
	var pg *harness.Postgres
	skipped, err := tb.do(func() { pg = harness.StartPostgres(tb, harness.PostgresOptions{}) })
	if err != nil {
		return err
	}
	if skipped != "" {
		r.rep.note(11, "Consumers not measured: %s.", skipped)
		return nil
	}
	n := r.sz.jsConsumerEvents
	if err := jsFillConsumerStream(ctx, r, url, n); err != nil {
		return err
	}
	rates := map[int][]float64{}
	uses := map[int][]cpuUse{}
	for round := 0; round < r.sz.jsRounds; round++ {
		order := slices.Clone(jsMembers)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, k := range order {
			var dsn string
			if _, err := tb.do(func() { dsn = pg.NewDatabase(tb) }); err != nil {
				return err
			}
			rate, use, err := r.jsConsume(ctx, url, dsn, fmt.Sprintf("bench-%d-%d", round, k), k, n)
			if err != nil {
				return fmt.Errorf("%d member(s): %w", k, err)
			}
			rates[k] = append(rates[k], rate)
			uses[k] = append(uses[k], use)
			r.progress("  jetstream consumer, %d member(s): %.0f events/s, machine busy %.0f%%", k, rate, 100*use.busy)
		}
	}
	one := median(slices.Clone(rates[1]))
	for _, k := range jsMembers {
		p := fmt.Sprintf("jetstream_consumer_m%d_", k)
		rate := median(slices.Clone(rates[k]))
		r.rep.set(p+"events_per_s", rate)
		if k > 1 {
			r.rep.set(p+"vs_m1", rate/one)
		}
		// CPU: medians over the rounds, per event and as a share of the
		// machine.
		var self, busy, all []float64
		named := map[string][]float64{}
		for _, u := range uses[k] {
			self = append(self, float64(u.self.Microseconds())/float64(n))
			sum := u.self
			for _, c := range jsCPUNames {
				named[c.key] = append(named[c.key], float64(u.children[c.comm].Microseconds())/float64(n))
				sum += u.children[c.comm]
			}
			all = append(all, float64(sum)/float64(u.wall)/float64(r.rep.Meta.NumCPU))
			busy = append(busy, u.busy)
		}
		r.rep.set(p+"consumer_cpu_us_per_event", median(self))
		for _, c := range jsCPUNames {
			r.rep.set(p+c.key+"_cpu_us_per_event", median(named[c.key]))
		}
		r.rep.set(p+"cpu_share", median(all))
		r.rep.set(p+"machine_busy", median(busy))
	}
	mode := ""
	if r.cfg.Mode != Full {
		mode = fmt.Sprintf(" (%s; --full %s)", r.cfg.Mode, thousands(int64(sizesFor(Full).jsConsumerEvents)))
	}
	r.rep.note(11, "Consumers: %s events%s in the stream %s on the one server, applied by 1, 2 and 4 JetStreamConsumers (this process, each with its own connection and *sql.DB, pulls of 32) "+
		"of one durable pull consumer, made fresh each time, into the Inbox of a fresh database on a local PostgreSQL %s (the test harness's: fsync and synchronous_commit off); "+
		"the handler inserts one row, in the Inbox's transaction. Rate: events / (start → the last event acknowledged), every event applied once (checked by the table). "+
		"CPU: this process (the consumers), PostgreSQL (server and backends) and nats-server (the R1 server), per event, from /proc; share: their sum over the machine's CPUs; "+
		"busy: the whole machine's, whoever used it. %d round(s), member counts alternating; medians.",
		thousands(int64(n)), mode, jsConsumerStream, postgresVersion(ctx, pg), r.sz.jsRounds)
	return nil
}

// jsFillConsumerStream creates the consumers' stream on url and publishes
// n events into it.
func jsFillConsumerStream(ctx context.Context, r *runner, url string, n int) error {
	path, err := r.makeBacklog(ctx, "js-consumer.db", n)
	if err != nil {
		return err
	}
	msgs, err := jsMessages(ctx, path, n, "orders")
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url, nats.Timeout(10*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1<<16))
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := js.CreateStream(cctx, jetstream.StreamConfig{Name: jsConsumerStream, Subjects: []string{"orders.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		return err
	}
	if err := jsPublishWindow(js, msgs, 256); err != nil {
		return err
	}
	_, err = jsStored(ctx, st, n)
	return err
}

// jsConsume runs k members of a new durable consumer into the database at
// dsn until the n events of the stream are applied.
func (r *runner) jsConsume(ctx context.Context, url, dsn, durable string, k, n int) (float64, cpuUse, error) {
	// The durable consumer exists before the members start, as an
	// operator's would.
	nc, err := nats.Connect(url, nats.Timeout(10*time.Second))
	if err != nil {
		return 0, cpuUse{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, cpuUse{}, err
	}
	if _, err := js.CreateConsumer(ctx, jsConsumerStream, jetstream.ConsumerConfig{Durable: durable,
		AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy, AckWait: 30 * time.Second}); err != nil {
		return 0, cpuUse{}, err
	}
	defer js.DeleteConsumer(context.WithoutCancel(ctx), jsConsumerStream, durable)

	var settled atomic.Int64
	var last atomic.Int64 // unix nanoseconds of the last settled event
	done := make(chan struct{})
	onEvent := func(outbox.Event, consumer.Outcome, error) {
		last.Store(time.Now().UnixNano())
		if settled.Add(1) == int64(n) {
			close(done)
		}
	}
	handler := func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO bench_orders (id, n) VALUES ($1, $2)`, ev.ID, parseN(ev.Data))
		return err
	}
	var members []*consumer.JetStreamConsumer
	for i := range k {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return 0, cpuUse{}, err
		}
		defer db.Close()
		if i == 0 {
			if _, err := db.ExecContext(ctx, `CREATE TABLE bench_orders (id text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
				return 0, cpuUse{}, err
			}
		}
		// One after the other: each creates the Inbox's tables if absent.
		in, err := consumer.NewInbox(ctx, db, consumer.InboxOptions{Logger: r.log})
		if err != nil {
			return 0, cpuUse{}, err
		}
		c, err := consumer.NewJetStreamConsumer(in, handler, consumer.JetStreamConsumerOptions{
			Servers: []string{url}, Stream: jsConsumerStream, Durable: durable, Logger: r.log, OnEvent: onEvent})
		if err != nil {
			return 0, cpuUse{}, err
		}
		members = append(members, c)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	before := takeCPUSample()
	start := time.Now()
	for _, c := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Run(rctx)
		}()
	}
	werr := waitDone(ctx, done, drainTimeout(n, 0), func() error {
		return fmt.Errorf("%d of %d events settled", settled.Load(), n)
	})
	end := time.Unix(0, last.Load())
	use := before.until(takeCPUSample(), time.Since(start))
	cancel()
	wg.Wait()
	if werr != nil {
		return 0, cpuUse{}, werr
	}
	// Every event applied once: one row each.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return 0, cpuUse{}, err
	}
	defer db.Close()
	var rows, distinct int
	if err := db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT id) FROM bench_orders`).Scan(&rows, &distinct); err != nil {
		return 0, cpuUse{}, err
	}
	if rows != n || distinct != n {
		return 0, cpuUse{}, fmt.Errorf("%d rows (%d distinct) for %d events", rows, distinct, n)
	}
	return float64(n) / end.Sub(start).Seconds(), use, nil
}

// postgresVersion is the server's version ("15.10"), or "?".
func postgresVersion(ctx context.Context, pg *harness.Postgres) string {
	db, err := sql.Open("pgx", pg.DSN("postgres"))
	if err != nil {
		return "?"
	}
	defer db.Close()
	v := "?"
	_ = db.QueryRowContext(ctx, `SHOW server_version`).Scan(&v)
	return v
}
