package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// checkCounters compares what the limits are checked against with the rows
// themselves (harness.CheckPendingCounters).
func checkCounters(t testing.TB, db *sql.DB) {
	t.Helper()
	harness.CheckPendingCounters(t, db)
}

// execCounted runs q, as a plain-SQL writer would, and checks the counters
// after it.
func execCounted(t testing.TB, db *sql.DB, q string) {
	t.Helper()
	_, err := db.Exec(q)
	require.NoError(t, err, q)
	checkCounters(t, db)
}

func enqueueTopic(ctx context.Context, ob *Outbox, topic string, payload []byte) error {
	return ob.Transact(ctx, func(tx *sql.Tx) error {
		return ob.Enqueue(ctx, tx, Message{Topic: topic, Payload: payload})
	})
}

// parkDead enqueues n messages on a topic outside the relay's TopicPrefix
// and runs a relay until they are dead: messages parked at the end of the
// queue, the mark just before them.
func parkDead(t *testing.T, ob *Outbox, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		require.NoError(t, enqueueTopic(ctx, ob, "elsewhere/orders", []byte(`{}`)))
	}
	opts := fastRelay()
	opts.TopicPrefix = "till/"
	r, err := ob.NewRelay(&fakePublisher{}, opts)
	require.NoError(t, err)
	stop := startRelay(t, r)
	eventually(t, 5*time.Second, "dead", func() bool { return countState(t, ob, "dead") == n })
	stop()
	checkCounters(t, ob.DB())
}

// TestPendingLimitCountsOnlyPending: a limit on pending messages counts
// messages that are neither sent nor dead. Dead messages at the end of the
// queue, and the gap they leave when purged, used to fill it: the till could
// not sell, and RequeueDead failed with ErrFull too.
func TestPendingLimitCountsOnlyPending(t *testing.T) {
	ctx := context.Background()
	fill := func(t *testing.T, ob *Outbox, room int) {
		t.Helper()
		for i := 0; i < room; i++ {
			require.NoError(t, enqueueTopic(ctx, ob, "till/orders", []byte(`{}`)), "message %d of %d", i+1, room)
			checkCounters(t, ob.DB())
		}
		require.ErrorIs(t, enqueueTopic(ctx, ob, "till/orders", []byte(`{}`)), ErrFull)
		_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('till/orders', '{}')`)
		require.ErrorContains(t, err, "outbox full", "plain SQL is held to the same count")
	}
	t.Run("dead messages leave room", func(t *testing.T) {
		ob := openTest(t, Options{MaxPendingMessages: 5})
		parkDead(t, ob, 5)
		fill(t, ob, 5)
	})
	t.Run("requeue counted the same way", func(t *testing.T) {
		ob := openTest(t, Options{MaxPendingMessages: 5})
		parkDead(t, ob, 5)
		n, err := ob.RequeueDead(ctx)
		require.NoError(t, err, "five dead and nothing pending: room for five")
		require.EqualValues(t, 5, n)
		checkCounters(t, ob.DB())
		require.ErrorIs(t, enqueueTopic(ctx, ob, "till/orders", []byte(`{}`)), ErrFull)
	})
	t.Run("requeue beyond the limit fails whole", func(t *testing.T) {
		ob := openTest(t, Options{MaxPendingMessages: 5})
		parkDead(t, ob, 3)
		for i := 0; i < 3; i++ {
			require.NoError(t, enqueueTopic(ctx, ob, "till/orders", []byte(`{}`)))
		}
		_, err := ob.RequeueDead(ctx)
		require.ErrorIs(t, err, ErrFull)
		require.Equal(t, 3, countState(t, ob, "dead"), "nothing requeued")
		checkCounters(t, ob.DB())
	})
	t.Run("purged dead messages leave no gap", func(t *testing.T) {
		ob := openTest(t, Options{MaxPendingMessages: 5})
		parkDead(t, ob, 5)
		n, err := ob.PurgeDead(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 5, n)
		checkCounters(t, ob.DB())
		fill(t, ob, 5) // no relay marks in between
	})
	t.Run("dead between pending ones", func(t *testing.T) {
		ob := openTest(t, Options{MaxPendingMessages: 5})
		require.NoError(t, enqueueTopic(ctx, ob, "till/orders", []byte(`{}`)))
		parkDead(t, ob, 2) // the relay sends the first, then parks two
		require.NoError(t, enqueueTopic(ctx, ob, "till/orders", []byte(`{}`)))
		fill(t, ob, 4)
		// The relay drains: the mark passes the dead ones and the count
		// stays right.
		r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
		require.NoError(t, err)
		stop := startRelay(t, r)
		eventually(t, 5*time.Second, "drained", func() bool { return countState(t, ob, "pending") == 0 })
		stop()
		checkCounters(t, ob.DB())
		fill(t, ob, 5)
	})
	t.Run("a limit set on a file with dead rows counts them out", func(t *testing.T) {
		ob := openTest(t, Options{})
		parkDead(t, ob, 4)
		require.NoError(t, enqueueTopic(ctx, ob, "till/orders", []byte(`{}`)))
		ob2, err := New(ctx, ob.DB(), Options{MaxPendingMessages: 3, Logger: testLogger()})
		require.NoError(t, err)
		checkCounters(t, ob.DB())
		fill(t, ob2, 2)
	})
}

// checkCountersConservative is checkCounters for what a pending row that
// INSERT OR REPLACE deleted without a DELETE trigger leaves: counted
// still, never less than the rows.
func checkCountersConservative(t testing.TB, db *sql.DB) {
	t.Helper()
	var count, wantCount, bytes, wantBytes int64
	require.NoError(t, db.QueryRow(`SELECT
			CASE WHEN max_pending_count > 0 THEN max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq) - sent_seq - skipped ELSE 0 END,
			CASE WHEN max_pending_count > 0 THEN (SELECT count(*) FROM outbox WHERE seq > st.sent_seq AND dead_at IS NULL) ELSE 0 END,
			CASE WHEN max_pending_bytes > 0 THEN pending_bytes ELSE 0 END,
			CASE WHEN max_pending_bytes > 0 THEN (SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM outbox WHERE seq > st.sent_seq AND dead_at IS NULL) ELSE 0 END
		FROM outbox_state st`).Scan(&count, &wantCount, &bytes, &wantBytes))
	require.GreaterOrEqual(t, count, wantCount, "the pending count the limit sees, against the rows")
	require.GreaterOrEqual(t, bytes, wantBytes, "pending_bytes against the rows")
}

// idempotentWriters writes as plain-SQL writers with business-key ids do
// (ignore, replace, upsert), checking the counters after each statement.
func idempotentWriters(t *testing.T, opts Options) *Outbox {
	t.Helper()
	ctx := context.Background()
	ob := openTest(t, opts)
	db := ob.DB()
	execCounted(t, db, `INSERT INTO outbox (id, topic, payload) VALUES ('order-1', 't', '0123456789')`)
	for i := 0; i < 20; i++ {
		execCounted(t, db, `INSERT OR IGNORE INTO outbox (id, topic, payload) VALUES ('order-1', 't', '0123456789')`)
		execCounted(t, db, `INSERT INTO outbox (id, topic, payload) VALUES ('order-1', 't', '0123456789') ON CONFLICT DO NOTHING`)
	}
	// A replace on a connection with recursive_triggers, where SQLite
	// fires the DELETE trigger for the replaced row: counted once, exactly.
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `PRAGMA recursive_triggers = ON`)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `INSERT OR REPLACE INTO outbox (id, topic, payload) VALUES ('order-1', 't', '0123456789012345678901234567890123456789')`)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `PRAGMA recursive_triggers = OFF`)
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	checkCounters(t, db)
	// An upsert that changes the payload.
	execCounted(t, db, `INSERT INTO outbox (id, topic, payload) VALUES ('order-1', 't', '01234')
		ON CONFLICT (id) WHERE NOT (length(id) = 36 AND substr(id, 15, 1) = '7' AND substr(id, 9, 1) = '-')
		DO UPDATE SET payload = excluded.payload`)
	execCounted(t, db, `INSERT OR IGNORE INTO outbox (id, topic, payload) VALUES ('order-2', 't', '0123456789')`)
	// A replace without recursive_triggers deletes the pending row of that
	// id with no DELETE trigger: it stays counted (towards full) until the
	// relay drains the outbox or Open counts again. Once the newest row,
	// once in the middle (a gap).
	_, err = db.Exec(`INSERT OR REPLACE INTO outbox (id, topic, payload) VALUES ('order-1', 't', '01234567890123456789')`)
	require.NoError(t, err)
	checkCountersConservative(t, db)
	_, err = db.Exec(`INSERT OR REPLACE INTO outbox (id, topic, payload) VALUES ('order-2', 't', '012')`)
	require.NoError(t, err)
	checkCountersConservative(t, db)
	var pending int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM outbox_messages WHERE state = 'pending'`).Scan(&pending))
	require.Equal(t, 2, pending)
	_, err = New(ctx, db, Options{Logger: testLogger()})
	require.NoError(t, err)
	checkCounters(t, db)
	return ob
}

// TestPendingBytesCountOnlyInsertedRows: the byte limit counts rows really
// inserted. A plain-SQL writer that inserts idempotently with a business-key
// id (INSERT OR IGNORE, ON CONFLICT DO NOTHING) used to add the bytes of
// every row it did not insert, for good: after a full drain the outbox
// refused events as full with nothing pending.
func TestPendingBytesCountOnlyInsertedRows(t *testing.T) {
	t.Run("count limit alone", func(t *testing.T) { idempotentWriters(t, Options{MaxPendingMessages: 10}) })
	ctx := context.Background()
	ob := idempotentWriters(t, Options{MaxPendingBytes: 100, MaxPendingMessages: 10})
	db := ob.DB()
	// A replace without recursive_triggers leaves the row it deleted
	// counted, until the mark that passes every row.
	_, err := db.Exec(`INSERT OR REPLACE INTO outbox (id, topic, payload) VALUES ('order-2', 't', '0123456789')`)
	require.NoError(t, err)
	checkCountersConservative(t, db)
	// A full drain leaves nothing counted: the whole limit is free again.
	r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
	require.NoError(t, err)
	stop := startRelay(t, r)
	eventually(t, 5*time.Second, "drained", func() bool { return countState(t, ob, "pending") == 0 })
	stop()
	checkCounters(t, db)
	// A replace of a row that is not pending (sent) adds the new one only.
	execCounted(t, db, `INSERT OR REPLACE INTO outbox (id, topic, payload) VALUES ('order-1', 't', '0123456789')`)
	require.NoError(t, enqueueTopic(ctx, ob, "t", make([]byte, 90)), "the limit is all there")
	require.ErrorIs(t, enqueueTopic(ctx, ob, "t", make([]byte, 1)), ErrFull)
	checkCounters(t, db)

	// Counted again when the database is opened: a writer that broke the
	// contract (deleted a pending row by hand with the triggers off) cannot
	// leave the limit wrong for good.
	_, err = db.Exec(`UPDATE outbox_state SET pending_bytes = 99, skipped = 7`)
	require.NoError(t, err)
	_, err = New(ctx, db, Options{Logger: testLogger()})
	require.NoError(t, err)
	checkCounters(t, db)
}

// TestWritersNeverOwnSeq: a plain-SQL insert that set seq at or below what
// was sent used to be taken as sent and never published. Such a row, and one
// set into a gap the relay's read position has passed, is moved above every
// number used; a seq beyond the next is kept. Every such row is published,
// in commit order.
func TestWritersNeverOwnSeq(t *testing.T) {
	ctx := context.Background()
	var offset atomic.Int64 // the clock jumps forward, so marks get their own times
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	path := t.TempDir() + "/seq.db"
	ob, err := Open(ctx, path, Options{Logger: testLogger(), Now: clock, MaxPendingMessages: 100})
	require.NoError(t, err)
	defer ob.Close()
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.Envelope = EnvelopeRaw
	opts.TopicPrefix = "t" // a row on x is parked dead at once
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	execCounted(t, ob.DB(), `INSERT INTO outbox (topic, payload) VALUES ('t', 'a'), ('t', 'b')`)
	eventually(t, 5*time.Second, "a and b sent", func() bool { return countState(t, ob, "sent") == 2 })
	offset.Store(int64(time.Hour))
	execCounted(t, ob.DB(), `INSERT INTO outbox (topic, payload) VALUES ('t', 'c')`)
	eventually(t, 5*time.Second, "c sent", func() bool { return countState(t, ob, "sent") == 3 })
	// A purge that keeps the newest row: 1 and 2 go, 3 stays, so nothing
	// raises the floor.
	n, err := ob.PurgeSent(ctx, clock().Add(-time.Minute))
	require.NoError(t, err)
	require.EqualValues(t, 2, n)

	execCounted(t, ob.DB(), `INSERT INTO outbox (seq, topic, payload) VALUES (1, 't', 'd')`) // below what was sent
	execCounted(t, ob.DB(), `INSERT INTO outbox (seq, topic, payload) VALUES (0, 't', 'e')`) // an ORM that writes every column
	execCounted(t, ob.DB(), `INSERT INTO outbox (seq, topic, payload) VALUES (3000, 't', 'f')`)
	execCounted(t, ob.DB(), `INSERT INTO outbox (seq, id, topic, payload, type, content_type, created_at, attempts, last_error, dead_at)
		VALUES (NULL, 'order-9', 't', 'g', '', '', 0, 0, NULL, NULL)`)
	eventually(t, 5*time.Second, "every row published", func() bool { return pub.publishedCount() == 7 })
	pub.mu.Lock()
	require.Equal(t, []string{"a", "b", "c", "d", "e", "f", "g"}, pub.published, "in commit order")
	pub.mu.Unlock()
	require.Equal(t, []int64{3, 4, 5, 3000, 3001}, outboxSeqs(t, ob.DB()), "above what was sent, none reused; a seq beyond the next is kept (its gap counted as skipped)")

	// A seq into the gap a purged dead row left, below the relay's read
	// position: still published, after what was committed before it.
	execCounted(t, ob.DB(), `INSERT INTO outbox (topic, payload) VALUES ('x', 'dead')`)
	execCounted(t, ob.DB(), `INSERT INTO outbox (topic, payload) VALUES ('t', 'h')`)
	eventually(t, 5*time.Second, "h sent", func() bool { return pub.publishedCount() == 8 })
	require.Equal(t, 1, countState(t, ob, "dead"))
	_, err = ob.PurgeDead(ctx)
	require.NoError(t, err)
	execCounted(t, ob.DB(), `INSERT INTO outbox (seq, topic, payload) VALUES (8, 't', 'i')`)
	eventually(t, 5*time.Second, "i sent", func() bool { return pub.publishedCount() == 9 })
	pub.mu.Lock()
	require.Equal(t, []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}, pub.published)
	pub.mu.Unlock()
}

// insertPrograms compiles q (without running it) and returns, from EXPLAIN,
// the trigger programs the insert itself starts for every row, and the
// number of opcodes of every trigger program by name.
func insertPrograms(t *testing.T, db *sql.DB, q string, args ...any) (perRow int, sizes map[string]int) {
	t.Helper()
	rows, err := db.Query(`EXPLAIN `+q, args...)
	require.NoError(t, err)
	defer rows.Close()
	sizes = map[string]int{}
	program := "" // "" is the statement's own program
	for rows.Next() {
		var addr, p1, p2, p3, p5 int
		var op string
		var p4, comment sql.NullString
		require.NoError(t, rows.Scan(&addr, &op, &p1, &p2, &p3, &p4, &p5, &comment))
		// A trigger's program starts with an Init whose P4 names it.
		if op == "Init" && strings.HasPrefix(p4.String, "-- TRIGGER ") {
			program = strings.TrimPrefix(p4.String, "-- TRIGGER ")
		}
		if program == "" {
			if op == "Program" {
				perRow++
			}
			continue
		}
		sizes[program]++
	}
	require.NoError(t, rows.Err())
	return perRow, sizes
}

// TestInsertPathCost: what every insert runs is one small trigger program
// that reads outbox_state; the work needed only rarely (a seq to renumber,
// the limits) is a program of its own, run only then. An outbox row used
// to cost two trigger programs per insert, of 187 and 557 opcodes,
// whose registers SQLite sets up on every row even when they did nothing:
// at synchronous=NORMAL a transaction of one order and one event ran at
// 0.76 of the same with a bare row.
func TestInsertPathCost(t *testing.T) {
	ob := openTest(t, Options{})
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{insertSQLs[insertPlain], []any{"id", "t", []byte("p"), "", "", 1}},
		{insertSQLs[insertNoContentType], []any{"id", "t", []byte("p"), "", 1}},
		{insertSQLs[insertExpiring], []any{"id", "t", []byte("p"), "", "", 1, 1, 1}},
		{`INSERT INTO outbox (topic, payload) VALUES ('t', 'p')`, nil},
	} {
		perRow, sizes := insertPrograms(t, ob.DB(), q.sql, q.args...)
		require.Equal(t, 1, perRow, "trigger programs every insert runs: %s", q.sql)
		// 90: its WHEN also refuses, for every writer, topics no broker
		// takes (a GLOB that runs in full only outside printable ASCII)
		// and payloads over the stored limit (its cost: BENCHMARKS.md,
		// "The insert path after the input checks").
		require.LessOrEqual(t, sizes["outbox_inserted"], 90, "opcodes of the program every insert runs (%v)", sizes)
	}
}

// TestWriterSeqBehindTheRelay: with no limit set, the insert no longer
// looks for a writer's seq set into a gap (that look cost every insert a
// second seek); the relay finds such a row when it marks the range it lies
// in, and moves it to the end instead of taking it as sent. Here the row
// lands above the mark and behind the relay's read position, while the
// relay waits for acknowledgements: the case a mark would otherwise lose.
func TestWriterSeqBehindTheRelay(t *testing.T) {
	for _, limit := range []int64{0, 100} {
		t.Run(fmt.Sprintf("message limit %d", limit), func(t *testing.T) {
			ob := openTest(t, Options{MaxPendingMessages: limit})
			db := ob.DB()
			pub := &fakePublisher{hold: true}
			opts := fastRelay()
			opts.Envelope = EnvelopeRaw
			r, err := ob.NewRelay(pub, opts)
			require.NoError(t, err)
			startRelay(t, r)
			execCounted(t, db, `INSERT INTO outbox (topic, payload) VALUES ('t', 'a'), ('t', 'b')`)
			execCounted(t, db, `INSERT INTO outbox (seq, topic, payload) VALUES (10, 't', 'c')`) // beyond the next: kept
			eventually(t, 5*time.Second, "a, b and c in flight", func() bool { return pub.heldCount() == 3 })
			execCounted(t, db, `INSERT INTO outbox (seq, topic, payload) VALUES (5, 't', 'd')`) // behind the relay
			pub.release(3)
			eventually(t, 5*time.Second, "d published", func() bool { return pub.publishedCount() == 4 })
			pub.release(1)
			eventually(t, 5*time.Second, "all sent", func() bool { return countState(t, ob, "pending") == 0 })
			pub.mu.Lock()
			require.Equal(t, []string{"a", "b", "c", "d"}, pub.published, "d after what was read before it was written")
			pub.mu.Unlock()
			var seq int64
			require.NoError(t, db.QueryRow(`SELECT seq FROM outbox WHERE CAST(payload AS TEXT) = 'd'`).Scan(&seq))
			require.Greater(t, seq, int64(10), "moved above every number used")
			checkCounters(t, db)
		})
	}
}
