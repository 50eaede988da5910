package integration

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/compress"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// What the crash test (crash_test.go) and the power-loss test
// (power_test.go) share: the child process that commits orders and relays
// their events, the parent's handle on a child it will kill, the drain by a
// last relay, and the checks of what the broker received.

// ordersChild is what a child process is to do. It reaches the child as
// JSON in an environment variable of the child's test function, which runs
// it.
type ordersChild struct {
	DB         string // the database
	Broker     string // the broker's URL
	Client     string // the MQTT client id, and the relay's lease owner
	RolledBack string // the file listing the ids rolled back on purpose
	Seed       uint64
	Sync       outbox.Synchronous
	// Protocol is the MQTT version the child's relay speaks: the kill and
	// cut tests alternate 5 and 3.1.1 from child to child, so that both
	// run every cycle's checks, and a file goes from one to the other.
	Protocol outbox.MQTTProtocol
	// Report has the child print "committed <id>" on stdout as each commit
	// returns. The write reaches the pipe before the next commit starts,
	// and what is in a pipe when a process is killed is still read at the
	// other end: the parent learns every commit that returned, whatever
	// becomes of the files.
	Report bool
	// Checkpoint has the child checkpoint the WAL every 20-400 ms, as
	// SQLite's autocheckpoint does after every 1,000 pages, only more
	// often: so that kills land in checkpoints too, and WAL restarts.
	Checkpoint bool
	// OwnTx has the child commit each order in a transaction of its own
	// (BeginTx, Enqueue, Commit, Notify), whose level the library cannot
	// tell, and declare RelayOptions.WritersAtFull: at FULL its relay then
	// publishes with no fsync before, and a cut must still find no phantom.
	OwnTx bool
	// Batched has the child's relay batch and compress
	// (crashRelayOptions), and each of its transactions commit one to four
	// orders, each event on one of crashTopics: so that batches hold
	// events of several transactions and form while it runs, not only
	// from the backlog a killed child left.
	Batched bool
	// Priorities has the child give each order's event one of
	// crashPriorities, at random: the relay then sends a backlog highest
	// first, and the checks hold commit order within each priority.
	Priorities bool
}

// crashPriorities are the priorities a child of a mixed run commits, and
// how often each: half the events 0, a quarter 5, a quarter 9.
var crashPriorities = []int{0, 0, 5, 9}

const (
	// childFailed starts the line a child prints before it exits on a
	// failure.
	childFailed = "ORDERS CHILD FAILED"
	// committedPrefix starts the lines of a child's Report.
	committedPrefix = "committed "
)

// runOrdersChild is the whole of a child test function: it does nothing
// (skipping with skipMsg) unless env carries its orders, and otherwise
// never returns.
func runOrdersChild(t *testing.T, env, skipMsg string) {
	s := os.Getenv(env)
	if s == "" {
		t.Skip(skipMsg)
	}
	var c ordersChild
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s: %v\n", childFailed, env, err)
		os.Exit(2)
	}
	c.run()
}

// run commits an order every crashCommitEvery, every crashRollbackEvery-th
// one rolled back on purpose, while a relay publishes the events; it
// returns never, and exits on a failure or when the parent is gone.
func (c ordersChild) run() {
	die := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, childFailed+": "+format+"\n", args...)
		os.Exit(2)
	}
	// The parent holds our stdin open: EOF means it is gone, and an
	// orphan must not run on.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	rng := rand.New(rand.NewPCG(c.Seed, 0x5eed))
	level := slog.LevelWarn
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx := context.Background()
	// Limits far above the test's needs keep the pending counters running,
	// so that every kill checks them (see crashInspect).
	ob, err := outbox.Open(ctx, c.DB, outbox.Options{Logger: logger, Synchronous: c.Sync,
		MaxPendingBytes: 1 << 40, MaxPendingMessages: 1 << 40})
	if err != nil {
		die("open: %v", err)
	}
	pub, err := outbox.NewMQTTPublisher(crashMQTTOptions(c.Broker, c.Client, c.Protocol))
	if err != nil {
		die("publisher: %v", err)
	}
	ropts := crashRelayOptions(c.Client, c.Batched)
	ropts.WritersAtFull = c.OwnTx
	relay, err := ob.NewRelay(pub, ropts)
	if err != nil {
		die("relay: %v", err)
	}
	go func() {
		// Run returns only on a failure here: nothing cancels it.
		err := relay.Run(ctx)
		die("relay.Run returned: %v", err)
	}()
	if c.Checkpoint {
		// A generator of its own: rng is the commit loop's.
		crng := rand.New(rand.NewPCG(c.Seed, 0xc4ec))
		go func() {
			for {
				// The schedule of the experiment, not a wait for anything.
				time.Sleep(time.Duration(20+crng.IntN(381)) * time.Millisecond)
				// PASSIVE waits for no one, so it never fails busy.
				var busy, frames, copied int
				if err := ob.DB().QueryRowContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &copied); err != nil {
					die("checkpoint: %v", err)
				}
			}
		}()
	}

	side, err := os.OpenFile(c.RolledBack, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		die("side file: %v", err)
	}
	pace := time.NewTicker(crashCommitEvery)
	for n := 1; ; n++ {
		<-pace.C
		orders := 1
		if c.Batched {
			orders = 1 + rng.IntN(4)
		}
		msgs := make([]outbox.Message, orders)
		for i := range msgs {
			m := &msgs[i]
			m.ID, m.Topic, m.Type = outbox.NewID(), crashTopic, "order.created"
			if c.Batched {
				m.Topic = crashTopics[rng.IntN(len(crashTopics))]
			}
			if c.Priorities {
				m.Priority = crashPriorities[rng.IntN(len(crashPriorities))]
			}
			pad := rng.IntN(3000)
			if rng.IntN(20) == 0 {
				pad = 4000 + rng.IntN(4000) // overflow pages
			}
			m.Payload, _ = json.Marshal(crashPayload{ID: m.ID, Topic: m.Topic, Priority: m.Priority, Pad: strings.Repeat("x", pad)})
		}
		rollback := n%crashRollbackEvery == 0
		commit := ob.Transact
		if c.OwnTx {
			commit = ownTx(ob)
		}
		err := commit(ctx, func(tx *sql.Tx) error {
			for _, m := range msgs {
				if _, err := tx.Exec(`INSERT INTO orders (event_id, client, priority) VALUES (?, ?, ?)`, m.ID, c.Client, m.Priority); err != nil {
					return err
				}
				if err := ob.Enqueue(ctx, tx, m); err != nil {
					return err
				}
			}
			if !rollback {
				return nil
			}
			// Recorded before the rollback: a crash in between leaves an
			// id on file that was never committed, which is what the
			// file claims. Recorded after it, a crash could leave a
			// rolled-back id unlisted.
			for _, m := range msgs {
				if _, err := side.WriteString(m.ID + "\n"); err != nil {
					return err
				}
			}
			if err := side.Sync(); err != nil {
				return err
			}
			return errCrashRollback
		})
		switch {
		case rollback && !errors.Is(err, errCrashRollback):
			die("order %d: want the rollback, got %v", n, err)
		case !rollback && err != nil:
			die("order %d: %v", n, err)
		case !rollback && c.Report:
			for _, m := range msgs {
				if _, err := fmt.Fprintln(os.Stdout, committedPrefix+m.ID); err != nil {
					die("report: %v", err)
				}
			}
		}
	}
}

// ownTx runs fn in a transaction of the caller's own, as an application
// that does not use Transact would: begin, fn, commit or roll back, then
// Notify.
func ownTx(ob *outbox.Outbox) func(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return func(ctx context.Context, fn func(tx *sql.Tx) error) error {
		tx, err := ob.DB().BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		ob.Notify()
		return nil
	}
}

// killedChild is one child process, run by a parent that kills it.
type killedChild struct {
	t              *testing.T
	name           string
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	stdout, stderr bytes.Buffer // read only once it has exited
	exited         chan error
	killed         bool
}

// startKilledChild runs the test function test of this binary as a child
// named name, with o in its environment variable env. The caller defers
// done.
func startKilledChild(t *testing.T, name, test, env string, o ordersChild) *killedChild {
	t.Helper()
	spec, err := json.Marshal(o)
	require.NoError(t, err)
	c := &killedChild{t: t, name: name, exited: make(chan error, 1)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.timeout=10m")
	c.cmd.Env = append(os.Environ(), env+"="+string(spec))
	// The child exits when this pipe closes, should this process die
	// without killing it.
	c.stdin, err = c.cmd.StdinPipe()
	require.NoError(t, err)
	c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
	require.NoError(t, c.cmd.Start())
	go func() { c.exited <- c.cmd.Wait() }()
	return c
}

// gone says whether the child has exited.
func (c *killedChild) gone() bool {
	select {
	case err := <-c.exited:
		c.exited <- err
		return true
	default:
		return false
	}
}

// waitConnected waits until the child's client is connected to b (or the
// child has exited, which kill reports).
func (c *killedChild) waitConnected(b *harness.Mochi, client string) {
	c.t.Helper()
	harness.Eventually(c.t, 20*time.Second, client+" connected to the broker (or exited)", func() bool {
		if c.gone() {
			return true
		}
		_, ok := b.Server().Clients.Get(client)
		return ok
	})
}

// runFor lets the child run for d, or until it exits.
func (c *killedChild) runFor(d time.Duration) {
	select {
	case <-time.After(d): // the experiment: when to pull the plug
	case err := <-c.exited:
		c.exited <- err
	}
}

// kill kills the child with SIGKILL, checks that it had not exited by
// itself and wrote no failure, and returns how many connections its relay
// lost.
func (c *killedChild) kill() (lostConns int) {
	t := c.t
	t.Helper()
	require.False(t, c.gone(), "%s exited by itself", c.name)
	require.NoError(t, c.cmd.Process.Kill())
	err := <-c.exited
	c.killed = true
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee) && ee.ExitCode() == -1, "%s: want killed by a signal, got %v", c.name, err)
	for _, bad := range []string{"DATA RACE", childFailed, "panic:"} {
		require.NotContains(t, c.stderr.String(), bad, "%s output", c.name)
	}
	return strings.Count(c.stderr.String(), crashLostConn)
}

// committed lists the ids the child reported committed (ordersChild.Report),
// once it is dead.
func (c *killedChild) committed() []string {
	var ids []string
	sc := bufio.NewScanner(bytes.NewReader(c.stdout.Bytes()))
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), committedPrefix); ok && len(id) == 36 {
			ids = append(ids, id)
		}
	}
	return ids
}

// done leaves no child behind (after a failed check, it is still running),
// and logs its output when the test failed or verbose is set.
func (c *killedChild) done(verbose bool) {
	if !c.killed {
		c.cmd.Process.Kill()
		<-c.exited
	}
	c.stdin.Close()
	if c.t.Failed() || verbose {
		c.t.Logf("%s output:\n%s%s", c.name, c.stderr.String(), c.stdout.String())
	}
}

// crashMessage is one MQTT message the broker routed, decoded: its events
// (a batch's, in order) and whether it came compressed.
type crashMessage struct {
	origin, topic string
	events        []outbox.Event
	compressed    bool
	err           error
}

// decodeMessage reads m as a consumer would (DecodeEventsMQTT), and holds
// the relay to its marks: over MQTT 5 (where every structured message has
// a Content Type) a compressed payload says its content-encoding.
func decodeMessage(m harness.Message) crashMessage {
	c := crashMessage{origin: m.Client, topic: m.Topic, compressed: compress.Sniff(m.Payload) != compress.None}
	user := make([]outbox.UserProperty, len(m.User))
	said := false
	for i, u := range m.User {
		user[i] = outbox.UserProperty{Key: u.Key, Value: u.Val}
		said = said || u.Key == "content-encoding"
	}
	if m.ContentType != "" && c.compressed != said {
		c.err = fmt.Errorf("over MQTT 5, compressed %v but content-encoding given %v", c.compressed, said)
		return c
	}
	c.events, c.err = outbox.DecodeEventsMQTT(m.Payload, m.ContentType, user)
	return c
}

// crashRecord is what the broker routed, in order.
type crashRecord struct {
	*harness.Recorder[crashMessage]
}

// recordEvents records, decoded, every message b routes.
func recordEvents(t *testing.T, b *harness.Mochi) crashRecord {
	t.Helper()
	rec, err := harness.Record(b, "crash/#", decodeMessage)
	require.NoError(t, err)
	return crashRecord{rec}
}

// events are the events delivered, in order: a batch's one by one, and a
// message that could not be decoded as one delivery with its error.
func (r crashRecord) events() []crashDelivery {
	var ds []crashDelivery
	for _, m := range r.All() {
		if m.err != nil {
			ds = append(ds, crashDelivery{origin: m.origin, topic: m.topic, evErr: m.err})
			continue
		}
		for _, ev := range m.events {
			ds = append(ds, crashDelivery{origin: m.origin, topic: m.topic, ev: ev})
		}
	}
	return ds
}

// wireShape is how the events went: in how many MQTT messages, how many
// of those batches, and compressed; how many the final relay sent (the
// rest, the children: few when each is killed before its first read of a
// backlog is out).
type wireShape struct {
	messages, batches, batched, most, compressed, byFinal int
}

func (r crashRecord) shape(final string) wireShape {
	var s wireShape
	for _, m := range r.All() {
		s.messages++
		if m.origin == final {
			s.byFinal++
		}
		n := len(m.events)
		if n > 1 {
			s.batches++
			s.batched += n
		}
		s.most = max(s.most, n)
		if m.compressed {
			s.compressed++
		}
	}
	return s
}

func (s wireShape) String() string {
	mean := 0.0
	if s.batches > 0 {
		mean = float64(s.batched) / float64(s.batches)
	}
	return fmt.Sprintf("%d of them batches (%d events, %.1f a batch, at most %d), %d compressed, %d sent by the final relay",
		s.batches, s.batched, mean, s.most, s.compressed, s.byFinal)
}

// check says whether the events went as the relay was asked: batched
// (some batches, none over crashBatchEvents, some compressed) or one a
// message, uncompressed.
func (s wireShape) check(t *testing.T, batched bool) {
	t.Helper()
	if !batched {
		require.Zero(t, s.batches, "batches from an unbatched relay")
		require.Zero(t, s.compressed, "compressed messages from a relay that does not compress")
		return
	}
	require.Positive(t, s.batches, "no batch: the relay published every event alone")
	require.LessOrEqual(t, s.most, crashBatchEvents, "a batch over Batch.MaxEvents")
	require.Positive(t, s.compressed, "nothing compressed")
}

// createOrders creates the database with its orders table: each order's
// event id, the child that committed it and its event's priority.
func createOrders(t *testing.T, path string) {
	t.Helper()
	ob, err := outbox.Open(context.Background(), path, outbox.Options{Logger: testLogger()})
	require.NoError(t, err)
	_, err = ob.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE, client TEXT NOT NULL,
		priority INTEGER NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	require.NoError(t, ob.Close())
}

// commitBacklog commits n orders before any child runs, one a
// transaction, their events on crashTopic with the priorities of
// crashPriorities in turn: a backlog in which a higher priority follows a
// lower one, so that the first child, sending the highest first, must
// overtake.
func commitBacklog(t *testing.T, path string, n int) {
	t.Helper()
	ctx := context.Background()
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: testLogger()})
	require.NoError(t, err)
	defer ob.Close()
	for i := range n {
		m := outbox.Message{ID: outbox.NewID(), Topic: crashTopic, Type: "order.created", Priority: crashPriorities[i%len(crashPriorities)]}
		m.Payload, err = json.Marshal(crashPayload{ID: m.ID, Topic: m.Topic, Priority: m.Priority})
		require.NoError(t, err)
		require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
			if _, err := tx.Exec(`INSERT INTO orders (event_id, client, priority) VALUES (?, 'backlog', ?)`, m.ID, m.Priority); err != nil {
				return err
			}
			return ob.Enqueue(ctx, tx, m)
		}))
	}
	require.NoError(t, ob.Close())
}

// openReadOnly opens the database as a killed process left it: a read-only
// connection neither checkpoints nor deletes the WAL, so the next child
// still recovers from that state.
func openReadOnly(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?mode=ro")
	require.NoError(t, err)
	return db
}

// drainRest lets one relay, in this process, finish the job: it relays
// what the children left straight to the broker (not through their link)
// until nothing is pending. The test's end closes ob and stops the relay,
// if the caller has not; log has what the relay logged.
func drainRest(t *testing.T, path string, sync outbox.Synchronous, brokerURL, client string, backlog int, batched bool) (ob *outbox.Outbox, stop func(), log *harness.LogBuffer) {
	t.Helper()
	log = &harness.LogBuffer{}
	ob, err := outbox.Open(context.Background(), path, outbox.Options{Synchronous: sync,
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	pub, err := outbox.NewMQTTPublisher(crashMQTTOptions(brokerURL, client, outbox.ProtocolAuto))
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	relay, err := ob.NewRelay(pub, crashRelayOptions(client, batched))
	require.NoError(t, err)
	stop = startRelay(t, relay)
	harness.Eventually(t, time.Minute+time.Duration(backlog)*10*time.Millisecond, "the final relay drains the outbox",
		func() bool { return countState(t, ob, "pending") == 0 })
	return ob, stop, log
}

// crashOrder is a committed order: its row, the child that committed it,
// and its event's priority.
type crashOrder struct {
	rowid    int64
	client   string
	priority int
}

// readOrders returns the orders in db, by event id.
func readOrders(t *testing.T, db *sql.DB) map[string]crashOrder {
	t.Helper()
	committed := map[string]crashOrder{}
	rows, err := db.Query(`SELECT id, event_id, client, priority FROM orders ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var id string
		var o crashOrder
		require.NoError(t, rows.Scan(&o.rowid, &id, &o.client, &o.priority))
		committed[id] = o
	}
	require.NoError(t, rows.Err())
	return committed
}

// readRolledBack returns the ids the children rolled back on purpose, and
// checks that none of them is among the committed orders.
func readRolledBack(t *testing.T, path string, committed map[string]crashOrder) map[string]bool {
	t.Helper()
	rolledBack := map[string]bool{}
	side, err := os.ReadFile(path)
	require.NoError(t, err)
	sc := bufio.NewScanner(bytes.NewReader(side))
	for sc.Scan() {
		if id := sc.Text(); len(id) == 36 { // a line cut short by a kill is no id
			rolledBack[id] = true
		}
	}
	require.NoError(t, sc.Err())
	for id := range rolledBack {
		_, ok := committed[id]
		require.False(t, ok, "event %s is listed as rolled back but its order was committed", id)
	}
	return rolledBack
}

// undelivered waits a little for every committed order's event to be
// delivered (mochi acknowledges a publish before it routes it) and returns
// those that were not, in commit order.
func undelivered(rec crashRecord, committed map[string]crashOrder) []string {
	var missing []string
	harness.WaitFor(10*time.Second, func() bool {
		seen := map[string]bool{}
		for _, d := range rec.events() {
			seen[d.ev.ID] = true
		}
		missing = missing[:0]
		for id := range committed {
			if !seen[id] {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0
	})
	slices.SortFunc(missing, func(a, b string) int { return cmp.Compare(committed[a].rowid, committed[b].rowid) })
	return missing
}

// deliveryCheck is what checkDeliveries found.
type deliveryCheck struct {
	first  map[string]int64 // event id -> the sequence of its first delivery
	dups   int
	dupsBy map[string]int // re-sending process -> duplicates it sent
	// phantom lists, once each, the events delivered whose order is not
	// in the database; rolledBackSent those of them rolled back on purpose.
	phantom, rolledBackSent []string
	seqReused               int    // first deliveries of a sequence number an earlier event was delivered with
	seqChanged              int    // duplicates with another sequence than their first delivery's
	disorder                string // the first delivery out of commit order within its topic and priority, described
	// overtook counts first deliveries of an event committed after one
	// of its topic delivered later: a higher priority's sent ahead of a
	// backlog.
	overtook int
	bad      error // the first malformed delivery
}

// checkDeliveries goes through every delivery, in the order the broker
// routed them. A duplicate is counted against the process that sent it
// again, i.e. against the crash (or cut) before it. First deliveries of
// committed events must come in commit order within their topic and
// priority, by the envelope's sequence and by the orders' own row order (a
// batch of one topic may overtake an earlier event of another, and a
// higher priority a backlog of a lower one); the payload must carry its
// order's priority.
func checkDeliveries(ds []crashDelivery, committed map[string]crashOrder, rolledBack map[string]bool) deliveryCheck {
	c := deliveryCheck{first: map[string]int64{}, dupsBy: map[string]int{}}
	bySeq := map[int64]string{} // sequence -> the first event delivered with it
	type last struct{ seq, row int64 }
	type stream struct {
		topic    string
		priority int
	}
	lastOf := map[stream]last{}  // topic and priority -> its last first delivery
	newest := map[string]int64{} // topic -> the highest sequence first delivered
	for i, d := range ds {
		if err := wellFormed(d); err != nil {
			if c.bad == nil {
				c.bad = fmt.Errorf("delivery %d (by %s): %w", i, d.origin, err)
			}
			continue
		}
		id, seq := d.ev.ID, d.ev.Sequence
		if s, ok := c.first[id]; ok {
			c.dups++
			c.dupsBy[d.origin]++
			if s != seq {
				c.seqChanged++
			}
			continue
		}
		c.first[id] = seq
		if other, ok := bySeq[seq]; ok && other != id {
			c.seqReused++
		} else {
			bySeq[seq] = id
		}
		o, ok := committed[id]
		if !ok {
			c.phantom = append(c.phantom, id)
			if rolledBack[id] {
				c.rolledBackSent = append(c.rolledBackSent, id)
			}
			continue
		}
		if p := payloadPriority(d); p != o.priority && c.bad == nil {
			c.bad = fmt.Errorf("delivery %d (by %s): event %s of priority %d carries priority %d", i, d.origin, id, o.priority, p)
		}
		if seq < newest[d.topic] {
			c.overtook++
		}
		newest[d.topic] = max(newest[d.topic], seq)
		s := stream{d.topic, o.priority}
		l := lastOf[s]
		if c.disorder == "" && (seq <= l.seq || o.rowid <= l.row) {
			c.disorder = fmt.Sprintf("delivery %d (by %s) on %s, priority %d: sequence %d after %d, order row %d after %d",
				i, d.origin, d.topic, o.priority, seq, l.seq, o.rowid, l.row)
		}
		lastOf[s] = last{seq, o.rowid}
	}
	return c
}

// wellFormed checks a delivery's envelope and that its payload belongs to it.
func wellFormed(d crashDelivery) error {
	if d.evErr != nil {
		return d.evErr
	}
	if d.ev.Source != crashSource {
		return fmt.Errorf("source %q, want %q", d.ev.Source, crashSource)
	}
	var p crashPayload
	if err := json.Unmarshal(d.ev.Data, &p); err != nil {
		return fmt.Errorf("data: %w", err)
	}
	if p.ID != d.ev.ID {
		return fmt.Errorf("payload of %s in the envelope of %s", p.ID, d.ev.ID)
	}
	if p.Topic != d.topic {
		return fmt.Errorf("event %s of topic %s in a message to %s", p.ID, p.Topic, d.topic)
	}
	return nil
}

// payloadPriority is the priority a well-formed delivery's payload says
// its event was committed with.
func payloadPriority(d crashDelivery) int {
	var p crashPayload
	json.Unmarshal(d.ev.Data, &p) // wellFormed has read it
	return p.Priority
}

// phantoms describes the phantom deliveries briefly: how many, and the
// first few ids.
func (c deliveryCheck) phantoms() string {
	if len(c.phantom) == 0 {
		return ""
	}
	return fmt.Sprintf("%d events delivered whose order is not in the database (%d of them rolled back on purpose), e.g. %s",
		len(c.phantom), len(c.rolledBackSent), strings.Join(c.phantom[:min(3, len(c.phantom))], ", "))
}

// mostDups is the most duplicates one process sent, and which.
func (c deliveryCheck) mostDups() (n int, by string) {
	for origin, d := range c.dupsBy {
		if d > n {
			n, by = d, origin
		}
	}
	return n, by
}
