package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/durable"
)

// eventLog orders what the relay did across goroutines.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(format string, args ...any) {
	l.mu.Lock()
	l.events = append(l.events, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *eventLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// loggingPublisher notes each publish in an eventLog.
type loggingPublisher struct {
	*fakePublisher
	log *eventLog
}

func (p loggingPublisher) Publish(topic string, payload []byte) Token {
	ev, _ := DecodeEvent(payload)
	p.log.add("publish %d", ev.Sequence)
	return p.fakePublisher.Publish(topic, payload)
}

// TestDurableBeforePublish: at synchronous=NORMAL a commit returns before
// the WAL is on the disk, and the relay used to read it and publish it at
// once — a power cut could then undo a transaction whose event the broker
// had. The relay now makes the WAL durable after reading a batch and before
// publishing it: every publish follows a sync that came after its commit,
// and there is at most one sync per batch read.
func TestDurableBeforePublish(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{Synchronous: SyncNormal})
	log := &eventLog{}
	pub := loggingPublisher{&fakePublisher{}, log}
	opts := fastRelay()
	opts.ReadSize = 100
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	var syncs atomic.Int64
	r.hooks.syncWAL = func() error {
		syncs.Add(1)
		log.add("sync")
		return r.wal.Sync()
	}
	// A backlog first, then a trickle.
	for i := 1; i <= 450; i++ {
		commitOrder(t, ob, "t", i)
		log.add("commit %d", i)
	}
	startRelay(t, r)
	eventually(t, 10*time.Second, "the backlog", func() bool { return pub.publishedCount() == 450 })
	require.LessOrEqual(t, syncs.Load()-r.markSyncs.Load(), int64(5), "at most one sync per batch read: 450 rows in batches of 100")
	for i := 451; i <= 470; i++ {
		// Noted before the commit: the relay, idle, cannot publish it
		// before, and a note after could come after the relay's sync.
		log.add("commit %d", i)
		commitOrder(t, ob, "t", i)
		eventually(t, 5*time.Second, "the trickle", func() bool { return pub.publishedCount() == i })
	}
	require.Greater(t, r.wal.Syncs.Load(), int64(0), "the real fsync ran")

	// Every publish follows a sync made after its commit.
	committed := map[int64]int{} // seq -> index of its commit in the log
	lastSync := -1
	events := log.all()
	for i, e := range events {
		var n int64
		if e == "sync" {
			lastSync = i
		}
		if _, err := fmt.Sscanf(e, "commit %d", &n); err == nil {
			committed[n] = i
		}
		if _, err := fmt.Sscanf(e, "publish %d", &n); err == nil {
			require.Greater(t, lastSync, committed[n], "message %d published without a sync after its commit", n)
		}
	}

	// A sync that fails publishes nothing and says why; the relay goes on
	// once it can.
	fail := atomic.Bool{}
	fail.Store(true)
	r2pub := &fakePublisher{}
	ob2 := openTest(t, Options{Synchronous: SyncNormal})
	r2, err := ob2.NewRelay(r2pub, fastRelay())
	require.NoError(t, err)
	r2.hooks.syncWAL = func() error {
		if fail.Load() {
			return errors.New("input/output error")
		}
		return r2.wal.Sync()
	}
	commitOrder(t, ob2, "t", 1)
	startRelay(t, r2)
	eventually(t, 5*time.Second, "the error told", func() bool {
		st, err := r2.Stats(ctx)
		require.NoError(t, err)
		return st.LastError != ""
	})
	st, _ := r2.Stats(ctx)
	require.Contains(t, st.LastError, "durable before publishing")
	require.Zero(t, r2pub.publishedCount())
	fail.Store(false)
	eventually(t, 5*time.Second, "published once it can", func() bool { return r2pub.publishedCount() == 1 })
}

// gapPublisher checks, at every publish, how far the published messages run
// ahead of the last durable mark: what a power cut would have the next
// relay send again.
type gapPublisher struct {
	*fakePublisher
	durable *atomic.Int64 // the mark as it was when the last sync began
	maxGap  atomic.Int64
}

func (p *gapPublisher) Publish(topic string, payload []byte) Token {
	ev, _ := DecodeEvent(payload)
	gap := ev.Sequence - p.durable.Load()
	for {
		m := p.maxGap.Load()
		if gap <= m || p.maxGap.CompareAndSwap(m, gap) {
			break
		}
	}
	return p.fakePublisher.Publish(topic, payload)
}

// TestPublishedAheadOfDurableMarkBounded: the relay marks messages sent on
// a connection at synchronous=NORMAL, and a power cut undoes the marks made
// since the WAL's last fsync; the next relay sends those messages again.
// What runs ahead of the durable mark must stay within a crash's bound,
// Window + markSlots, whatever the batch size: the fsync of each batch read
// covers only the marks before it, and a batch is read ahead of the one
// being published, which let up to 2 × ReadSize more run ahead (482 with a
// window of 8, before durableGate). The gate syncs when half the bound runs
// ahead, and holds dispatch at the bound.
func TestPublishedAheadOfDurableMarkBounded(t *testing.T) {
	for _, window := range []int{1, 8, 64} {
		t.Run(fmt.Sprintf("window %d", window), func(t *testing.T) { testPublishedAheadOfDurableMark(t, window) })
	}
}

func testPublishedAheadOfDurableMark(t *testing.T, window int) {
	ob := openTest(t, Options{})
	const rows = 2000
	for i := 1; i <= rows; i++ {
		commitOrder(t, ob, "t", i)
	}
	var durable atomic.Int64
	pub := &gapPublisher{fakePublisher: &fakePublisher{}, durable: &durable}
	opts := fastRelay()
	opts.Window = window
	opts.ReadSize = 256
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	// A sync makes durable what was committed before it began: the mark
	// read just before it.
	r.hooks.syncWAL = func() error {
		var mark int64
		if err := ob.DB().QueryRow(`SELECT sent_seq FROM outbox_state`).Scan(&mark); err != nil {
			return err
		}
		if err := r.wal.Sync(); err != nil {
			return err
		}
		if mark > durable.Load() {
			durable.Store(mark)
		}
		return nil
	}
	startRelay(t, r)
	eventually(t, 20*time.Second, "the backlog drained", func() bool { return countState(t, ob, "sent") == rows })
	bound := int64(opts.Window + markSlots(opts.Window))
	require.LessOrEqual(t, pub.maxGap.Load(), bound,
		"published ahead of the durable mark: a power cut would have them all sent again")
	t.Logf("most published ahead of the durable mark: %d (bound %d)", pub.maxGap.Load(), bound)
}

// TestRelayStatsWALSyncs: the fsyncs durable before publish costs are
// counted where they are made and shown in the relay's Stats, so that an
// operator and outboxlab bench can see what the guarantee costs: one per
// batch read for a backlog, one per event for a trickle.
func TestRelayStatsWALSyncs(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{Synchronous: SyncNormal})
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.ReadSize = 100
	// A session that ends and starts again reads the unmarked rows again
	// (a batch read, and its sync). On a loaded machine this test once
	// counted two syncs more than one per event, likely so; a long lease
	// keeps a late renewal from ending the session (nothing else wants it).
	opts.LeaseTTL = time.Minute
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	stats := func() RelayStats {
		st, err := r.Stats(ctx)
		require.NoError(t, err)
		return st
	}
	batchSyncs := func() int64 { st := stats(); return st.WALSyncs - st.MarkSyncs }
	markSyncs := func() int64 { return stats().MarkSyncs }
	require.Zero(t, batchSyncs())
	for i := 1; i <= 450; i++ {
		commitOrder(t, ob, "t", i)
	}
	startRelay(t, r)
	eventually(t, 10*time.Second, "the backlog", func() bool { return pub.publishedCount() == 450 })
	// 450 rows committed before the relay started: four batches of 100
	// and one of 50; the read-ahead's reads are batch reads too. A mark's
	// sync is counted before it begins (durable.Gate.SyncLoop): one under
	// way makes the count one lower for a moment, never higher.
	eventually(t, 5*time.Second, "the batch reads' syncs", func() bool { return batchSyncs() >= 5 })
	require.Equal(t, int64(5), batchSyncs(), "one fsync per batch read")
	marks := markSyncs()
	for i := 451; i <= 470; i++ {
		commitOrder(t, ob, "t", i)
		eventually(t, 5*time.Second, "the trickle", func() bool { return pub.publishedCount() == i })
		eventually(t, 5*time.Second, "the trickle's syncs", func() bool { return batchSyncs() >= int64(5+i-450) })
		require.Equal(t, int64(5+i-450), batchSyncs(), "one fsync per event of a trickle")
	}
	require.Equal(t, marks, markSyncs(), "a trickle needs no sync for the marks")
	require.Equal(t, 1, pub.connectCount(), "one session: another one reads the unmarked rows again")
}

// TestTransactAtFullNeedsNoSyncBeforePublish: what Transact committed at
// synchronous=FULL was synced by its COMMIT, so the relay publishes it
// without an fsync of its own; a transaction of the application's own, or
// another connection's insert (either may be at NORMAL), is synced first,
// as is a batch that holds such a row among Transact's.
func TestTransactAtFullNeedsNoSyncBeforePublish(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{}) // SyncFull, the default
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.LeaseTTL = time.Minute // one session: another reads the unmarked rows again
	r, next := startRelayInSteps(t, ob, pub, opts)
	batchSyncs := func() int64 {
		st, err := r.Stats(ctx)
		require.NoError(t, err)
		return st.WALSyncs - st.MarkSyncs
	}
	for i := 0; i < 20; i++ {
		commitOrder(t, ob, "t", i)
		next("Transact's event")
	}
	require.Zero(t, batchSyncs(), "Transact at FULL: no fsync before publishing")

	// The relay sees the commit before Transact returns (it watches the
	// WAL): the row is known as Transact's from before its COMMIT.
	ob.hooks.afterCommit = func() { // the 20 above, and this one
		eventually(t, 5*time.Second, "published before Transact returned", func() bool { return pub.publishedCount() == 21 })
	}
	commitOrder(t, ob, "t", 50)
	ob.hooks.afterCommit = nil
	next("Transact's event, seen before Transact returned")
	require.Zero(t, batchSyncs(), "Transact at FULL, seen before it returned: no fsync before publishing")

	commitOwnTx(t, ob)
	next("a transaction of one's own")
	require.Equal(t, int64(1), batchSyncs(), "a transaction of one's own is synced before publishing")

	sidecarInsert(t, dbPath(t, ob), "NORMAL", 1)
	next("another connection's insert")
	require.Equal(t, int64(2), batchSyncs(), "another connection's insert is synced before publishing")

	commitOrder(t, ob, "t", 100)
	next("Transact's event again")
	require.Equal(t, int64(2), batchSyncs())
	require.Equal(t, 1, pub.connectCount(), "one session: another reads the unmarked rows again")
}

// startRelayInSteps starts a relay on ob with pub and waits until it is
// connected; next(what) waits for one more publish than the last call did.
func startRelayInSteps(t *testing.T, ob *Outbox, pub *fakePublisher, opts RelayOptions) (r *Relay, next func(what string)) {
	t.Helper()
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 5*time.Second, "connected", func() bool { return pub.connectCount() == 1 })
	published := 0
	return r, func(what string) {
		t.Helper()
		published++
		eventually(t, 5*time.Second, what, func() bool { return pub.publishedCount() == published })
	}
}

// commitOwnTx commits one event in a transaction of the caller's own (not
// Transact's), then wakes the relay.
func commitOwnTx(t *testing.T, ob *Outbox) {
	t.Helper()
	ctx := context.Background()
	tx, err := ob.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(ctx, tx, Message{Topic: "t", Payload: []byte(`{"own":1}`)}))
	require.NoError(t, tx.Commit())
	ob.Notify()
}

// TestWritersAtFullNeedNoSyncBeforePublish: with every writer declared at
// FULL, the rows of a transaction of one's own and of another connection
// go out with no fsync of the relay's, as Transact's do; without the
// declaration each is synced first (the test above). A relay on an Outbox
// opened at NORMAL refuses the declaration.
func TestWritersAtFullNeedNoSyncBeforePublish(t *testing.T) {
	ctx := context.Background()
	_, err := openTest(t, Options{Synchronous: SyncNormal}).NewRelay(&fakePublisher{}, RelayOptions{WritersAtFull: true})
	require.ErrorContains(t, err, "WritersAtFull on an Outbox opened at SyncNormal")

	ob := openTest(t, Options{}) // SyncFull, the default
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.LeaseTTL = time.Minute
	opts.WritersAtFull = true
	r, next := startRelayInSteps(t, ob, pub, opts)
	for i := 0; i < 5; i++ {
		commitOwnTx(t, ob)
		next("a transaction of one's own")
		sidecarInsert(t, dbPath(t, ob), "FULL", i)
		next("another connection's insert")
		commitOrder(t, ob, "t", i)
		next("Transact's event")
	}
	st, err := r.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.WALSyncs-st.MarkSyncs, "writers declared at FULL: no fsync before publishing")
	require.Equal(t, 1, pub.connectCount())
}

// TestRowIntoAGapBelowTransactsIsSynced: a writer that sets seq (against
// the table's contract, which the schema tolerates) commits a row at
// NORMAL into a gap below a row that Transact committed at FULL, after it.
// Read in one batch with Transact's row, it must be synced before it is
// published: judging the batch by its last row, Transact's, let it out with
// no fsync at all, to be lost in a power cut after the broker had it.
func TestRowIntoAGapBelowTransactsIsSynced(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{}) // SyncFull, the default
	side, err := sql.Open("sqlite", "file:"+dbPath(t, ob)+"?_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
	require.NoError(t, err)
	defer side.Close()
	_, err = side.Exec(`INSERT INTO outbox (seq, topic, payload) VALUES (100, 'shop/1', '{"n":100}')`)
	require.NoError(t, err)
	commitOrder(t, ob, "t", 1) // seq 101, durable at its COMMIT, and 100 with it
	_, err = side.Exec(`INSERT INTO outbox (seq, topic, payload) VALUES (50, 'shop/1', '{"n":50}')`)
	require.NoError(t, err)
	require.Equal(t, []int64{50, 100, 101}, outboxSeqs(t, ob.DB()), "the row into the gap keeps its seq (no limit is set)")

	pub := &fakePublisher{}
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 5*time.Second, "three published", func() bool { return pub.publishedCount() == 3 })
	st, err := r.Stats(ctx)
	require.NoError(t, err)
	require.NotZero(t, st.WALSyncs-st.MarkSyncs, "a row committed at NORMAL went out without an fsync")
}

// TestReadAheadWaitsForTheMarksSync: a batch read ahead is made durable by
// the gate's next sync of the marks if one begins after the read, and
// syncs itself only when dispatch wants it first and no such sync is under
// way (or that one failed); a sync already under way at the read covers
// nothing of it. Before, each batch read made a sync of
// its own (a backlog's drain: 4 per 1,000 events besides the marks' 4.5).
func TestReadAheadWaitsForTheMarksSync(t *testing.T) {
	ob := openTest(t, Options{Synchronous: SyncNormal})
	r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
	require.NoError(t, err)
	var syncs atomic.Int64
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var holding, failing atomic.Bool
	r.hooks.syncWAL = func() error {
		syncs.Add(1)
		if holding.Load() {
			entered <- struct{}{}
			<-release
			if failing.Load() {
				return errors.New("input/output error")
			}
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &session{r: r, dctx: ctx, gate: durable.NewGate(r.syncWAL(), &r.markSyncs, 100)}
	read := func() batch {
		return batch{rows: []row{{outgoing: outgoing{seq: 1, id: "a"}}}, ticket: s.gate.Ticket()}
	}
	ready := func(b *batch, need chan struct{}) chan struct{} {
		done := make(chan struct{})
		go func() { defer close(done); s.makeDurable(b, need) }()
		return done
	}

	// The marks' sync, begun after the read, is the batch's.
	b, need := read(), make(chan struct{})
	done := ready(&b, need)
	require.NoError(t, s.gate.SyncNow())
	<-done
	require.NoError(t, b.err)
	require.Equal(t, int64(1), syncs.Load(), "no sync of its own")

	// Wanted first: it syncs itself.
	syncs.Store(0)
	b, need = read(), make(chan struct{})
	done = ready(&b, need)
	close(need)
	<-done
	require.NoError(t, b.err)
	require.Equal(t, int64(1), syncs.Load())

	// A sync under way at the read does not cover it: the batch, wanted,
	// syncs again after it.
	syncs.Store(0)
	holding.Store(true)
	marks := make(chan error, 1)
	go func() { marks <- s.gate.SyncNow() }()
	<-entered
	b, need = read(), make(chan struct{})
	holding.Store(false)
	done = ready(&b, need)
	release <- struct{}{}
	require.NoError(t, <-marks)
	close(need)
	<-done
	require.NoError(t, b.err)
	require.Equal(t, int64(2), syncs.Load(), "the marks' sync, then the batch's own")

	// Wanted while the marks' sync begun after the read is under way: it
	// waits for that one; and syncs itself if that one fails.
	for _, fails := range []bool{false, true} {
		syncs.Store(0)
		b, need = read(), make(chan struct{})
		done = ready(&b, need)
		holding.Store(true)
		go func() { marks <- s.gate.SyncNow() }()
		<-entered
		holding.Store(false)
		close(need)
		failing.Store(fails)
		release <- struct{}{}
		if fails {
			require.Error(t, <-marks)
		} else {
			require.NoError(t, <-marks)
		}
		failing.Store(false)
		<-done
		require.NoError(t, b.err)
		require.Equal(t, map[bool]int64{false: 1, true: 2}[fails], syncs.Load(), "failed: %v", fails)
	}
}
