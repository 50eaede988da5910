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
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// The crash test: a child process (this test binary, running
// TestCrashChild) commits orders with their events and relays them, over a
// link with 20 ms of latency, to a broker in the parent; the parent kills it
// with SIGKILL at random moments, over and over, and checks the file after
// every kill. Then a relay in the parent drains what is left, and the test
// checks the promises: nothing committed is lost, nothing rolled back is
// published, first deliveries come in commit order, a crash duplicates at
// most the window, nothing is dead or charged.
//
//	OUTBOX_CRASH_CYCLES=2000 go test -race -run TestCrashKill9 -v .  # a long run (default 30 kills)
//	OUTBOX_CRASH_SEED=12345 ...                                      # the same delays again
//	OUTBOX_TEST_LOG=1 ...                                            # the children's logs too

const (
	crashEnvDB         = "OUTBOX_CRASH_CHILD_DB" // set: TestCrashChild acts on this database
	crashEnvBroker     = "OUTBOX_CRASH_CHILD_BROKER"
	crashEnvClient     = "OUTBOX_CRASH_CHILD_CLIENT"
	crashEnvRolledBack = "OUTBOX_CRASH_CHILD_ROLLEDBACK"
	crashEnvSeed       = "OUTBOX_CRASH_CHILD_SEED"

	crashTopic    = "crash/orders"
	crashSource   = "/crash/till"
	crashWindow   = 32
	crashLeaseTTL = 500 * time.Millisecond
	// Every crashRollbackEvery-th transaction of a child rolls back.
	crashRollbackEvery = 5
	// A commit every crashCommitEvery at most: orders arrive fast, yet
	// the backlog does not grow without bound over thousands of cycles,
	// while each child still leaves a backlog behind for the next one (a
	// killed child's lease is taken at once, its process being gone, but
	// the next one starts and connects first). Much faster (one fsync'd
	// commit after another) and the writer starves the relay's own writes
	// of the lock; no till works like that.
	crashCommitEvery = 8 * time.Millisecond
	// crashLinkDelay is the latency from a child to the broker: publishes
	// still on the wire when the child dies are lost with it, as a device
	// that loses power loses what it had not yet sent.
	crashLinkDelay = 20 * time.Millisecond
)

// crashRelayOptions make every phase happen often: purges every 20 ms of
// rows sent 50 ms ago (and with them incremental vacuum), small read
// batches, a short lease (in case a killed child's lease is not judged dead,
// as off Linux, it blocks the next one for a TTL), fast reconnects.
func crashRelayOptions(owner string) outbox.RelayOptions {
	return outbox.RelayOptions{
		Source:          crashSource,
		Window:          crashWindow,
		BatchSize:       64,
		AckTimeout:      10 * time.Second, // nothing here withholds a PUBACK: only a stall would
		Reconnect:       outbox.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
		Retry:           outbox.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		Retention:       50 * time.Millisecond,
		PurgeInterval:   20 * time.Millisecond,
		LeaseTTL:        crashLeaseTTL,
		ShutdownTimeout: time.Second,
		Owner:           owner,
	}
}

func crashMQTTOptions(brokerURL, clientID string) outbox.MQTTOptions {
	return outbox.MQTTOptions{Broker: brokerURL, ClientID: clientID, ConnectTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, KeepAlive: 5 * time.Second, PingTimeout: 5 * time.Second}
}

// crashPayload is the event data: the event's own id (so a delivery can be
// checked against its envelope) and padding of a random size, up to more
// than a page, so purges free pages for incremental vacuum and some rows
// use overflow pages.
type crashPayload struct {
	ID  string `json:"id"`
	Pad string `json:"pad"`
}

var errCrashRollback = errors.New("rolled back on purpose")

// TestCrashChild is the process that gets killed. It does nothing unless
// TestCrashKill9 started it.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashEnvDB)
	if path == "" {
		t.Skip("the child of TestCrashKill9; runs only when started by it")
	}
	die := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "CRASH CHILD FAILED: "+format+"\n", args...)
		os.Exit(2)
	}
	// The parent holds our stdin open: EOF means it is gone, and an
	// orphan must not run on.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	seed, _ := strconv.ParseUint(os.Getenv(crashEnvSeed), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	level := slog.LevelWarn
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx := context.Background()
	// Limits far above the test's needs keep the pending counters running,
	// so that every kill checks them (see crashInspect).
	ob, err := outbox.Open(ctx, path, outbox.Options{Logger: logger, MaxPendingBytes: 1 << 40, MaxPendingMessages: 1 << 40})
	if err != nil {
		die("open: %v", err)
	}
	client := os.Getenv(crashEnvClient)
	pub, err := outbox.NewMQTTPublisher(crashMQTTOptions(os.Getenv(crashEnvBroker), client))
	if err != nil {
		die("publisher: %v", err)
	}
	relay, err := ob.NewRelay(pub, crashRelayOptions(client))
	if err != nil {
		die("relay: %v", err)
	}
	go func() {
		// Run returns only on a failure here: nothing cancels it.
		err := relay.Run(ctx)
		die("relay.Run returned: %v", err)
	}()

	side, err := os.OpenFile(os.Getenv(crashEnvRolledBack), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		die("side file: %v", err)
	}
	pace := time.NewTicker(crashCommitEvery)
	for n := 1; ; n++ {
		<-pace.C
		id := outbox.NewID()
		rollback := n%crashRollbackEvery == 0
		pad := rng.IntN(3000)
		if rng.IntN(20) == 0 {
			pad = 4000 + rng.IntN(4000) // overflow pages
		}
		payload, _ := json.Marshal(crashPayload{ID: id, Pad: strings.Repeat("x", pad)})
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			if _, err := tx.Exec(`INSERT INTO orders (event_id, client) VALUES (?, ?)`, id, client); err != nil {
				return err
			}
			if err := ob.Enqueue(ctx, tx, outbox.Message{ID: id, Topic: crashTopic, Type: "order.created", Payload: payload}); err != nil {
				return err
			}
			if !rollback {
				return nil
			}
			// Recorded before the rollback: a crash in between leaves an
			// id on file that was never committed, which is what the
			// file claims. Recorded after it, a crash could leave a
			// rolled-back id unlisted.
			if _, err := side.WriteString(id + "\n"); err != nil {
				return err
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
		}
	}
}

// crashDelivery is one message the broker routed, with the client that
// published it (which child, or the final relay).
type crashDelivery struct {
	origin string
	ev     outbox.Event
	evErr  error
}

// crashInspect opens the database read-only after a crash, as it was left
// (a read-only connection neither checkpoints nor deletes the WAL, so the
// next child still recovers from the crash state), and checks it.
func crashInspect(t *testing.T, path string) (orders, pending int) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.Query(`PRAGMA integrity_check`)
	require.NoError(t, err)
	var report []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		report = append(report, line)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"ok"}, report, "PRAGMA integrity_check")
	// The pending bytes and skipped numbers kept by triggers and marks
	// (while the limits are set) agree with the rows, as the killed child
	// left them: the next child's Open would count them again.
	harness.CheckPendingCounters(t, db)
	var wantCount int64
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM outbox_messages WHERE state = 'pending'`).Scan(&wantCount))
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders))
	return orders, int(wantCount)
}

func crashEnvInt(t *testing.T, name string, def uint64) uint64 {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.ParseUint(s, 10, 64)
	require.NoError(t, err, "%s", name)
	return v
}

// startCrashLink starts the link from the children to the broker: a proxy
// with crashLinkDelay of latency one way, so that what a child sent within
// the last delay is still on the wire and is lost if the child dies (its
// connection closes). Without it, every byte a killed child had written
// would still reach the in-process broker, and a relay that marked rows
// sent before their PUBACK would hardly ever be caught.
func startCrashLink(t *testing.T, broker string) *harness.FaultProxy {
	p := harness.StartFaultProxy(t, broker)
	p.SetLatency(harness.ToBroker, crashLinkDelay)
	return p
}

// crashRun is the parent's side of the crash test.
type crashRun struct {
	t        *testing.T
	b        *harness.Mochi
	link     *harness.FaultProxy // between the children and the broker, with latency
	rng      *rand.Rand
	path     string // the database
	sidePath string // rolled-back event ids, one a line

	early, relayed int // kills before the relay connected, and after
	// lost counts, per client, connections its relay lost while it ran:
	// nothing here cuts them, but an overloaded machine may miss a
	// keepalive, and each lost connection may duplicate a window too.
	lost map[string]int
}

// crashLostConn is what a relay logs when its connection fails.
const crashLostConn = "outbox relay connection lost"

// cycle starts a child, kills it with SIGKILL after a random delay, and
// checks the file it leaves behind.
func (c *crashRun) cycle(n int, verbose bool) (orders, pending int) {
	t := c.t
	client := fmt.Sprintf("crash-child-%d", n)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(),
		crashEnvDB+"="+c.path,
		crashEnvBroker+"="+c.link.URL(),
		crashEnvClient+"="+client,
		crashEnvRolledBack+"="+c.sidePath,
		crashEnvSeed+"="+strconv.FormatUint(c.rng.Uint64(), 10),
	)
	// The child exits when this pipe closes, should this process die
	// without killing it.
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	defer stdin.Close()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	killed := false
	defer func() {
		if !killed { // a failed check below: leave no child behind
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() || verbose {
			t.Logf("child %d output:\n%s", n, out.String())
		}
	}()
	hasExited := func() bool {
		select {
		case err := <-exited:
			exited <- err
			return true
		default:
			return false
		}
	}

	// Most kills land while the child relays: the random delay starts once
	// its relay holds the lease and has connected. The others land at any
	// moment from its start: while it starts, opens and recovers the file,
	// commits, and waits for the dead child's lease.
	var delay time.Duration
	if c.rng.IntN(6) == 0 {
		c.early++
		delay = time.Duration(c.rng.IntN(400)) * time.Millisecond
	} else {
		c.relayed++
		delay = time.Duration(30+c.rng.IntN(371)) * time.Millisecond
		harness.Eventually(t, 20*time.Second, client+" connected to the broker (or exited)", func() bool {
			if hasExited() {
				return true
			}
			_, ok := c.b.Server().Clients.Get(client)
			return ok
		})
	}
	select {
	case <-time.After(delay): // the experiment: when to pull the plug
	case err := <-exited:
		exited <- err
	}
	require.False(t, hasExited(), "child %d exited by itself", n)
	require.NoError(t, cmd.Process.Kill())
	err = <-exited
	killed = true
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee) && ee.ExitCode() == -1, "child %d: want killed by a signal, got %v", n, err)
	for _, bad := range []string{"DATA RACE", "CRASH CHILD FAILED", "panic:"} {
		require.NotContains(t, out.String(), bad, "child %d output", n)
	}
	c.lost[client] += strings.Count(out.String(), crashLostConn)
	return crashInspect(t, c.path)
}

// TestCrashKill9 kills a writing, relaying process with SIGKILL at random
// moments, many times, then lets a relay finish and checks every promise.
func TestCrashKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the crash test re-executes the test binary (not possible under qemu-user)")
	}
	cycles := int(crashEnvInt(t, "OUTBOX_CRASH_CYCLES", 30))
	require.Positive(t, cycles, "OUTBOX_CRASH_CYCLES")
	seed := crashEnvInt(t, "OUTBOX_CRASH_SEED", uint64(time.Now().UnixNano()))
	t.Logf("crash test: %d cycles, seed %d (OUTBOX_CRASH_SEED=%d replays the same delays)", cycles, seed, seed)
	began := time.Now()

	b := harness.StartMochi(t, harness.MochiOptions{})
	rec, err := harness.Record(b, "crash/#", func(m harness.Message) crashDelivery {
		d := crashDelivery{origin: m.Client}
		d.ev, d.evErr = outbox.DecodeEvent(m.Payload)
		return d
	})
	require.NoError(t, err)

	dir := t.TempDir()
	run := &crashRun{
		t: t, b: b, link: startCrashLink(t, b.Addr()),
		rng:      rand.New(rand.NewPCG(seed, 0)),
		lost:     map[string]int{},
		path:     filepath.Join(dir, "till.db"),
		sidePath: filepath.Join(dir, "rolledback.txt"),
	}
	{
		ob, err := outbox.Open(context.Background(), run.path, outbox.Options{Logger: testLogger()})
		require.NoError(t, err)
		_, err = ob.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE, client TEXT NOT NULL)`)
		require.NoError(t, err)
		require.NoError(t, ob.Close())
	}

	childLog := os.Getenv("OUTBOX_TEST_LOG") != ""
	var backlog int // pending after the last kill
	for n := 1; n <= cycles; n++ {
		orders, pending := run.cycle(n, childLog)
		backlog = pending
		if testing.Verbose() && (n%10 == 0 || n == cycles) {
			t.Logf("  after kill %d: %d orders committed, %d events pending, %d deliveries so far", n, orders, pending, rec.Count())
		}
	}
	killing := time.Since(began)

	// Let one relay finish the job, in this process, until nothing is
	// pending and the broker has routed every committed event.
	finalLog := &harness.LogBuffer{}
	ob, err := outbox.Open(context.Background(), run.path, outbox.Options{Logger: slog.New(slog.NewTextHandler(finalLog, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	t.Cleanup(func() { ob.Close() })
	pub, err := outbox.NewMQTTPublisher(crashMQTTOptions(b.URL(), "crash-final"))
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	relay, err := ob.NewRelay(pub, crashRelayOptions("crash-final"))
	require.NoError(t, err)
	stop := startRelay(t, relay)
	harness.Eventually(t, time.Minute+time.Duration(backlog)*10*time.Millisecond, "the final relay drains the outbox",
		func() bool { return countState(t, ob, "pending") == 0 })
	drained := time.Since(began) - killing

	// What was committed, in commit order, and what was rolled back.
	type order struct {
		rowid  int64
		client string
	}
	committed := map[string]order{}
	rows, err := ob.DB().Query(`SELECT id, event_id, client FROM orders ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var o order
		require.NoError(t, rows.Scan(&o.rowid, &id, &o.client))
		committed[id] = o
	}
	require.NoError(t, rows.Err())
	rolledBack := map[string]bool{}
	side, err := os.ReadFile(run.sidePath)
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

	// mochi acknowledges a publish before routing it: give it a moment.
	var missing []string
	harness.WaitFor(10*time.Second, func() bool {
		seen := map[string]bool{}
		for _, d := range rec.All() {
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
	if len(missing) > 0 {
		slices.SortFunc(missing, func(a, b string) int { return cmp.Compare(committed[a].rowid, committed[b].rowid) })
		t.Fatalf("LOST: %d of %d committed events never delivered, e.g. %s (order %d, committed by %s)",
			len(missing), len(committed), missing[0], committed[missing[0]].rowid, committed[missing[0]].client)
	}
	stop()
	run.lost["crash-final"] += strings.Count(finalLog.String(), crashLostConn)

	// Every delivery: well formed, committed, never rolled back. First
	// deliveries in commit order, by the envelope's sequence and by the
	// orders' own row order. A duplicate is counted against the process
	// that sent it again, i.e. against the crash before it.
	deliveries := rec.All()
	first := map[string]int64{} // event id -> sequence
	dupsBy := map[string]int{}  // re-sending process -> duplicates
	var lastSeq, lastRow int64
	dups := 0
	for i, d := range deliveries {
		require.NoError(t, d.evErr, "delivery %d", i)
		require.Equal(t, crashSource, d.ev.Source)
		var p crashPayload
		require.NoError(t, json.Unmarshal(d.ev.Data, &p), "delivery %d data", i)
		require.Equal(t, d.ev.ID, p.ID, "delivery %d: payload and envelope belong together", i)
		require.False(t, rolledBack[d.ev.ID], "rolled-back event %s was published (delivery %d, by %s)", d.ev.ID, i, d.origin)
		o, ok := committed[d.ev.ID]
		require.True(t, ok, "phantom: delivered event %s (by %s) has no committed order", d.ev.ID, d.origin)
		if seq, ok := first[d.ev.ID]; ok {
			require.Equal(t, seq, d.ev.Sequence, "a duplicate of %s carries the same sequence", d.ev.ID)
			dups++
			dupsBy[d.origin]++
			continue
		}
		first[d.ev.ID] = d.ev.Sequence
		if d.ev.Sequence <= lastSeq || o.rowid <= lastRow {
			t.Fatalf("first deliveries out of commit order at delivery %d (by %s): sequence %d after %d, order row %d after %d",
				i, d.origin, d.ev.Sequence, lastSeq, o.rowid, lastRow)
		}
		lastSeq, lastRow = d.ev.Sequence, o.rowid
	}
	maxDups, maxBy, lostConns := 0, "", 0
	for origin, n := range dupsBy {
		if n > maxDups {
			maxDups, maxBy = n, origin
		}
	}
	for _, n := range run.lost {
		lostConns += n
	}
	dead, pending := countState(t, ob, "dead"), countState(t, ob, "pending")
	var attempts int
	require.NoError(t, ob.DB().QueryRow(`SELECT coalesce(max(attempts), 0) FROM outbox`).Scan(&attempts))

	// A crash duplicates what was in flight and what was acknowledged but
	// not yet recorded; a lost connection only what was in flight.
	// The bound the README gives: Window + max(Window, 32).
	perKill := crashWindow + max(crashWindow, 32)
	t.Logf("crash test figures (seed %d, window %d):", seed, crashWindow)
	t.Logf("  kill -9 cycles            %7d  (%d while relaying, 30-400 ms after it connected; %d at 0-400 ms after start)", cycles, run.relayed, run.early)
	t.Logf("  integrity_check           %7s  after every kill", "ok")
	t.Logf("  orders committed          %7d", len(committed))
	t.Logf("  orders rolled back        %7d  delivered: 0", len(rolledBack))
	t.Logf("  events delivered, unique  %7d  of %d committed; first deliveries in commit order", len(first), len(committed))
	t.Logf("  deliveries in all         %7d", len(deliveries))
	t.Logf("  duplicates                %7d  total, bound kills x %d + connections lost x window = %d", dups, perKill, perKill*cycles+crashWindow*lostConns)
	t.Logf("  duplicates after one kill %7d  at most (sent again by %s), bound window + mark slots = %d", maxDups, maxBy, perKill)
	t.Logf("  dead / pending / charged  %3d / %d / %d", dead, pending, attempts)
	t.Logf("  connections lost          %7d  (none is caused on purpose; each may add a window of duplicates)", lostConns)
	t.Logf("  final drain               %7d  pending after the last kill, drained in %s", backlog, drained.Round(100*time.Millisecond))
	t.Logf("  time                      %7s  killing, %s in all", killing.Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond))

	require.Equal(t, len(committed), len(first), "every committed event delivered")
	for origin, n := range dupsBy {
		require.LessOrEqual(t, n, perKill+crashWindow*run.lost[origin],
			"duplicates sent again by %s, after one crash and %d lost connections, exceed the bound", origin, run.lost[origin])
	}
	require.LessOrEqual(t, dups, perKill*cycles+crashWindow*lostConns, "duplicates exceed kills x (window + mark slots) + lost connections x window")
	require.Zero(t, dead, "dead messages")
	require.Zero(t, pending, "pending messages")
	require.Zero(t, attempts, "attempts charged: a crash must never count against a message")
}
