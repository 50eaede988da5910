// Command peers measures this outbox beside the SQLite queues a user would
// pick instead, in one run and the way outboxlab bench's section 1 does:
// the same business transaction (one order row) alone, with a bare row
// (the least any outbox row costs), with Enqueue, with goqite's SendTx and
// with River's InsertTx (riversqlite), in interleaved rounds, at FULL and
// at NORMAL; then the database side of draining a backlog for each (no
// broker: publishing is a no-op).
//
//	cd peers && go run .            # about two minutes
//	cd peers && go run . -quick     # a smoke run
//	cd peers && go run . -json      # the same figures as one JSON object
//
// With -json it prints, instead of the tables, one object: the machine and
// the run's sizes, then one key per figure (enqueue_<mode>_<variant>_tx_per_s
// and _vs_bare, drain_<system>_events_per_s and _in_commit_order).
//
// It lives in a module of its own so that the library's go.mod gains
// nothing from the peers.
package main

import (
	"context"
	"database/sql"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"maragu.dev/goqite"

	"github.com/edgeoutbox/outbox"
)

//go:embed goqite_schema.sql
var goqiteSchema string

const (
	topic      = "bench/stores/42/orders"
	eventType  = "com.example.order.created"
	payloadLen = 200
)

func main() {
	quick := flag.Bool("quick", false, "small sizes, to check that everything runs")
	rounds := flag.Int("rounds", 9, "interleaved rounds per mode")
	fullTx := flag.Int("full-tx", 300, "transactions per variant per round at FULL")
	normalTx := flag.Int("normal-tx", 2000, "transactions per variant per round at NORMAL")
	backlog := flag.Int("backlog", 50_000, "events drained per system")
	asJSON := flag.Bool("json", false, "print one JSON object with the figures instead of the tables")
	flag.Parse()
	if *quick {
		*rounds, *fullTx, *normalTx, *backlog = 2, 30, 200, 2000
	}
	dir, err := os.MkdirTemp("", "outbox-peers-")
	check(err)
	defer os.RemoveAll(dir)
	ctx := context.Background()

	out := &report{json: *asJSON, figs: map[string]any{
		"quick": *quick, "rounds": *rounds, "full_tx": *fullTx, "normal_tx": *normalTx, "backlog": *backlog,
	}}
	out.printf("# Peers: this outbox, goqite and River on SQLite\n\n")
	out.printf("%s\n\n", out.machine())
	for _, mode := range []struct {
		name string
		sync outbox.Synchronous
		n    int
	}{{"FULL", outbox.SyncFull, *fullTx}, {"NORMAL", outbox.SyncNormal, *normalTx}} {
		enqueue(ctx, out, dir, mode.name, mode.sync, *rounds, mode.n)
	}
	drain(ctx, out, dir, *backlog)
	if out.json {
		out.figs["loadavg_end"] = loadAvg()
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		check(enc.Encode(out.figs))
	}
}

// report gets the run's figures: printed as Markdown tables as they come,
// or kept for one JSON object at the end (json).
type report struct {
	json bool
	figs map[string]any
}

func (r *report) printf(format string, args ...any) {
	if !r.json {
		fmt.Printf(format, args...)
	}
}

func (r *report) set(key string, v any) { r.figs[key] = v }

// variant is one way of writing the business transaction.
type variant struct {
	name string
	key  string // in the JSON keys
	tx   func(ctx context.Context, n int) error
}

type orderArgs struct {
	Payload []byte `json:"payload"`
}

func (orderArgs) Kind() string { return "order_created" }

type nopWorker struct {
	river.WorkerDefaults[orderArgs]
	done *atomic.Int64
}

func (w *nopWorker) Work(context.Context, *river.Job[orderArgs]) error {
	w.done.Add(1)
	return nil
}

func payload(n int) []byte {
	p := fmt.Appendf(nil, `{"order":%d,"item":"coffee","pad":"`, n)
	p = append(p, strings.Repeat("x", max(payloadLen-len(p)-2, 0))...)
	return append(p, `"}`...)
}

func insertOrder(ctx context.Context, tx *sql.Tx, n int) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO orders (item, total_cents) VALUES (?, ?)`, "coffee", 100+n%900)
	return err
}

// open returns an outbox file with an orders table, a bare outbox table,
// goqite's table and River's, all on the outbox's pool (its pragmas: WAL,
// the chosen synchronous, a busy timeout).
func open(ctx context.Context, path string, sync outbox.Synchronous) (*outbox.Outbox, *goqite.Queue, *river.Client[*sql.Tx]) {
	ob, err := outbox.Open(ctx, path, outbox.Options{Synchronous: sync, ReserveBytes: -1, Logger: slog.New(slog.DiscardHandler)})
	check(err)
	db := ob.DB()
	_, err = db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, total_cents INTEGER NOT NULL);
		CREATE TABLE outbox_bare (seq INTEGER PRIMARY KEY, topic TEXT NOT NULL, payload BLOB NOT NULL);`+goqiteSchema)
	check(err)
	q := goqite.New(goqite.NewOpts{DB: db, Name: "orders"})
	drv := riversqlite.New(db)
	mig, err := rivermigrate.New(drv, nil)
	check(err)
	_, err = mig.Migrate(ctx, rivermigrate.DirectionUp, nil)
	check(err)
	rc, err := river.NewClient(drv, &river.Config{Logger: slog.New(slog.DiscardHandler)}) // insert-only
	check(err)
	return ob, q, rc
}

func enqueue(ctx context.Context, out *report, dir, mode string, sync outbox.Synchronous, rounds, perRound int) {
	ob, q, rc := open(ctx, filepath.Join(dir, "enqueue-"+strings.ToLower(mode)+".db"), sync)
	defer ob.Close()
	db := ob.DB()
	inTx := func(body func(tx *sql.Tx, n int) error) func(context.Context, int) error {
		return func(ctx context.Context, n int) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := insertOrder(ctx, tx, n); err != nil {
				tx.Rollback()
				return err
			}
			if err := body(tx, n); err != nil {
				tx.Rollback()
				return err
			}
			return tx.Commit()
		}
	}
	variants := []variant{
		{"business alone", "business", inTx(func(*sql.Tx, int) error { return nil })},
		{"+ bare row", "bare", inTx(func(tx *sql.Tx, n int) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO outbox_bare (topic, payload) VALUES (?, ?)`, topic, payload(n))
			return err
		})},
		{"+ outbox Enqueue", "outbox", inTx(func(tx *sql.Tx, n int) error {
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: topic, Type: eventType, Payload: payload(n)})
		})},
		{"+ goqite SendTx", "goqite", inTx(func(tx *sql.Tx, n int) error {
			return q.SendTx(ctx, tx, goqite.Message{Body: payload(n)})
		})},
		{"+ River InsertTx", "river", inTx(func(tx *sql.Tx, n int) error {
			_, err := rc.InsertTx(ctx, tx, orderArgs{Payload: payload(n)}, nil)
			return err
		})},
	}
	rates := map[string][]float64{}
	n := 0
	for round := -1; round < rounds; round++ { // a warm-up round first
		for _, v := range variants {
			start := time.Now()
			for range perRound {
				n++
				check(v.tx(ctx, n))
			}
			if round >= 0 {
				rates[v.name] = append(rates[v.name], float64(perRound)/time.Since(start).Seconds())
			}
		}
	}
	bare := median(rates["+ bare row"])
	out.printf("## Enqueue at %s\n\n%d interleaved rounds of %d transactions; median rate; ratio to the business transaction plus a bare row.\n\n", mode, rounds, perRound)
	out.printf("| variant | tx/s | / bare row |\n|---|---:|---:|\n")
	for _, v := range variants {
		m := median(rates[v.name])
		out.printf("| %s | %.0f | %.2f |\n", v.name, m, m/bare)
		p := "enqueue_" + strings.ToLower(mode) + "_" + v.key + "_"
		out.set(p+"tx_per_s", m)
		out.set(p+"vs_bare", m/bare)
	}
	out.printf("\n")
}

// drain measures the database side of emptying a backlog of n events, each
// system as its users would: the relay with a publisher that acknowledges
// at once; goqite receiving and deleting 64 messages per transaction;
// River's workers with a 1 ms fetch cooldown.
func drain(ctx context.Context, out *report, dir string, n int) {
	out.printf("## Draining a backlog of %d events, database side only (no broker)\n\n| system | events/s | in commit order |\n|---|---:|---|\n", n)
	// The backlog is committed in one transaction, at NORMAL, before the
	// clock starts.
	fill := func(db *sql.DB, body func(tx *sql.Tx, i int) error) {
		tx, err := db.BeginTx(ctx, nil)
		check(err)
		for i := range n {
			check(body(tx, i))
		}
		check(tx.Commit())
	}
	openDrain := func(name string) (*outbox.Outbox, *goqite.Queue, *river.Client[*sql.Tx]) {
		return open(ctx, filepath.Join(dir, "drain-"+name+".db"), outbox.SyncNormal)
	}

	{ // the outbox
		ob, _, _ := openDrain("outbox")
		fill(ob.DB(), func(tx *sql.Tx, i int) error {
			return ob.Enqueue(ctx, tx, outbox.Message{Topic: topic, Type: eventType, Payload: payload(i)})
		})
		pub := &nopPublisher{}
		r, err := ob.NewRelay(pub, outbox.RelayOptions{})
		check(err)
		rctx, stop := context.WithCancel(ctx)
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		// Stats counts rows (milliseconds at this size): look only once
		// everything has been handed over.
		for pub.n.Load() < int64(n) {
			time.Sleep(time.Millisecond)
		}
		for {
			st, err := ob.Stats(ctx)
			check(err)
			if st.Pending == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		el := time.Since(start)
		stop()
		check(<-done)
		out.printf("| this outbox (relay, window 64, batches of 256, marks and durable-before-publish fsyncs included) | %.0f | yes |\n", float64(n)/el.Seconds())
		out.set("drain_outbox_events_per_s", float64(n)/el.Seconds())
		out.set("drain_outbox_in_commit_order", true)
		ob.Close()
	}
	{ // goqite
		ob, q, _ := openDrain("goqite")
		fill(ob.DB(), func(tx *sql.Tx, i int) error { return q.SendTx(ctx, tx, goqite.Message{Body: payload(i)}) })
		start := time.Now()
		got := 0
		for got < n {
			tx, err := ob.DB().BeginTx(ctx, nil)
			check(err)
			for range 64 {
				m, err := q.ReceiveTx(ctx, tx)
				check(err)
				if m == nil {
					break
				}
				check(q.DeleteTx(ctx, tx, m.ID))
				got++
			}
			check(tx.Commit())
		}
		el := time.Since(start)
		out.printf("| goqite (ReceiveTx + DeleteTx, 64 per transaction) | %.0f | yes (by created time) |\n", float64(n)/el.Seconds())
		out.set("drain_goqite_events_per_s", float64(n)/el.Seconds())
		out.set("drain_goqite_in_commit_order", true)
		ob.Close()
	}
	{ // River
		ob, _, rc := openDrain("river")
		fill(ob.DB(), func(tx *sql.Tx, i int) error {
			_, err := rc.InsertTx(ctx, tx, orderArgs{Payload: payload(i)}, nil)
			return err
		})
		var done atomic.Int64
		workers := river.NewWorkers()
		river.AddWorker(workers, &nopWorker{done: &done})
		wc, err := river.NewClient(riversqlite.New(ob.DB()), &river.Config{
			Logger:        slog.New(slog.DiscardHandler),
			Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100}},
			Workers:       workers,
			FetchCooldown: time.Millisecond,
		})
		check(err)
		start := time.Now()
		check(wc.Start(ctx))
		for {
			var left int
			check(ob.DB().QueryRowContext(ctx, `SELECT count(*) FROM river_job WHERE state <> 'completed'`).Scan(&left))
			if left == 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		el := time.Since(start)
		check(wc.Stop(ctx))
		out.printf("| River (riversqlite, 100 workers, FetchCooldown 1 ms) | %.0f | no (workers in parallel) |\n", float64(n)/el.Seconds())
		out.set("drain_river_events_per_s", float64(n)/el.Seconds())
		out.set("drain_river_in_commit_order", false)
		ob.Close()
	}
	out.printf("\n")
}

// nopPublisher acknowledges every publish at once, and counts them.
type nopPublisher struct{ n atomic.Int64 }

type doneToken struct{}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (doneToken) Done() <-chan struct{} { return closed }
func (doneToken) Error() error          { return nil }

func (*nopPublisher) Connect(context.Context) error         { return nil }
func (p *nopPublisher) Publish(string, []byte) outbox.Token { p.n.Add(1); return doneToken{} }
func (*nopPublisher) Disconnect()                           {}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// machine describes the run's machine and versions, and records them for
// the JSON object.
func (r *report) machine() string {
	var deps []string
	versions := map[string]string{}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "maragu.dev/goqite", "github.com/riverqueue/river", "github.com/riverqueue/river/riverdriver/riversqlite", "modernc.org/sqlite":
				deps = append(deps, d.Path+" "+d.Version)
				versions[d.Path] = d.Version
			}
		}
	}
	now, load := time.Now().UTC(), loadAvg()
	r.set("date", now.Format(time.RFC3339))
	r.set("nproc", runtime.NumCPU())
	r.set("os_arch", runtime.GOOS+"/"+runtime.GOARCH)
	r.set("go_version", runtime.Version())
	r.set("versions", versions)
	r.set("loadavg_start", load)
	return fmt.Sprintf("%s, %d CPUs, %s/%s; %s; load average %s", now.Format("2006-01-02 15:04 UTC"),
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, strings.Join(deps, ", "), load)
}

// loadAvg is the machine's load average over 1, 5 and 15 minutes.
func loadAvg() string {
	load, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(load))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}
