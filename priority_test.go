package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/migrate"
	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// TestPriorityColumn: the plain-SQL contract's priority column takes 0 to 9
// and refuses everything else at INSERT, whoever writes.
func TestPriorityColumn(t *testing.T) {
	ob := openTest(t, Options{})
	db := ob.DB()
	_, err := db.Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', 'default')`)
	require.NoError(t, err)
	for p := 0; p <= MaxPriority; p++ {
		_, err := db.Exec(`INSERT INTO outbox (topic, payload, priority) VALUES ('t', 'p', ?)`, p)
		require.NoError(t, err, "priority %d", p)
	}
	for _, bad := range []string{`10`, `-1`, `5.5`, `'9x'`, `NULL`, `'high'`, `x'09'`} {
		_, err := db.Exec(`INSERT INTO outbox (topic, payload, priority) VALUES ('t', 'p', ` + bad + `)`)
		require.Error(t, err, "priority %s", bad)
	}
	var n, sum int
	require.NoError(t, db.QueryRow(`SELECT count(*), sum(priority) FROM outbox`).Scan(&n, &sum))
	require.Equal(t, 11, n, "only the good ones")
	require.Equal(t, 45, sum, "the default is 0")
}

// TestEnqueuePriority: Message.Priority is stored and read back; out of
// range it is refused before anything is written, a good message before it
// in the same call included.
func TestEnqueuePriority(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{})
	for _, bad := range []int{MaxPriority + 1, -1} {
		err := ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, Message{Topic: "t", Payload: []byte(`{}`)}, Message{Topic: "t", Priority: bad})
		})
		require.ErrorIs(t, err, ErrInvalidMessage, "priority %d", bad)
	}
	var rows int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox`).Scan(&rows))
	require.Zero(t, rows, "nothing written")

	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
		return ob.Enqueue(ctx, tx,
			Message{Topic: "t", ID: "p0"},
			Message{Topic: "t", ID: "p9", Priority: 9, ContentType: "text/plain"},
			Message{Topic: "t", ID: "p3e", Priority: 3, Expiry: 3600e9})
	}))
	recs, err := ob.List(ctx, ListOptions{})
	require.NoError(t, err)
	require.Len(t, recs, 3)
	for i, want := range []int{0, 9, 3} {
		require.Equal(t, want, recs[i].Priority, recs[i].ID)
	}
	rec, err := ob.Get(ctx, "p9")
	require.NoError(t, err)
	require.Equal(t, 9, rec.Priority)
	require.Equal(t, "text/plain", rec.ContentType)
	var expires sql.NullInt64
	require.NoError(t, ob.DB().QueryRow(`SELECT expires_at FROM outbox WHERE id = 'p9'`).Scan(&expires))
	require.False(t, expires.Valid, "no expiry: none stored")
	require.NoError(t, ob.DB().QueryRow(`SELECT expires_at FROM outbox WHERE id = 'p3e'`).Scan(&expires))
	require.True(t, expires.Valid, "the expiry stored with the priority")
}

// TestMigrationToPriorities: a schema 8 file with sent, dead and pending rows
// keeps every row's state through the migration; every row gets priority 0,
// each priority's mark starts at the common one, and a new row is numbered
// above all of them.
func TestMigrationToPriorities(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v8.db")
	db, err := OpenDB(path, DBOptions{})
	require.NoError(t, err)
	require.NoError(t, migrate.SQLite(context.Background(), db, "outbox_schema", outboxMigrations[:8], "", ErrSchemaTooNew))
	// What a schema 8 relay leaves: 1..3 sent (3 marked last), 4 dead, 5
	// and 6 pending, limits set.
	_, err = db.Exec(`
		UPDATE outbox_state SET max_pending_count = 100, max_pending_bytes = 1000;
		INSERT INTO outbox (seq, id, topic, payload) VALUES
			(1, 'id-1', 't', 'p1'), (2, 'id-2', 't', 'p2'), (3, 'id-3', 't', 'p3'),
			(4, 'id-4', 't', 'p4'), (5, 'id-5', 't', 'p5'), (6, 'id-6', 't', 'p6');
		UPDATE outbox SET dead_at = 1500, attempts = 3 WHERE seq = 4;
		UPDATE outbox_state SET sent_seq = 2, sent_at = 1000;
		UPDATE outbox_state SET sent_seq = 3, sent_at = 2000;`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	ob := openTestPath(t, path, Options{MaxPendingMessages: 100, MaxPendingBytes: 1000})
	require.Equal(t, []migratedRow{
		{1, "id-1", "p1", "sent", 0},
		{2, "id-2", "p2", "sent", 0},
		{3, "id-3", "p3", "sent", 0},
		{4, "id-4", "p4", "dead", 3},
		{5, "id-5", "p5", "pending", 0},
		{6, "id-6", "p6", "pending", 0},
	}, migratedRows(t, ob))
	ctx := context.Background()
	sent, err := ob.List(ctx, ListOptions{State: StateSent})
	require.NoError(t, err)
	require.Len(t, sent, 3)
	require.EqualValues(t, 1000, sent[0].SentAt.UnixMilli(), "sent_at from the old log")
	require.EqualValues(t, 2000, sent[2].SentAt.UnixMilli())
	var marks, floor, priorities int64
	require.NoError(t, ob.DB().QueryRow(`SELECT sent_seq_0 + sent_seq_1 + sent_seq_2 + sent_seq_3 + sent_seq_4
		+ sent_seq_5 + sent_seq_6 + sent_seq_7 + sent_seq_8 + sent_seq_9, seq_floor,
		(SELECT count(*) FROM outbox WHERE priority <> 0) FROM outbox_state`).Scan(&marks, &floor, &priorities))
	require.EqualValues(t, 30, marks, "every priority's mark at the common one")
	require.EqualValues(t, 3, floor, "seq_floor at least the mark")
	require.Zero(t, priorities)
	st, err := ob.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Pending)
	require.EqualValues(t, 4, st.PendingBytes)
	require.EqualValues(t, 3, st.Sent)
	checkCounters(t, ob.DB())
	_, err = ob.DB().Exec(`DELETE FROM outbox WHERE seq = 2; INSERT INTO outbox (seq, topic, payload, priority) VALUES (2, 't', 'late', 9)`)
	require.NoError(t, err)
	var seq int64
	require.NoError(t, ob.DB().QueryRow(`SELECT seq FROM outbox WHERE payload = 'late'`).Scan(&seq))
	require.EqualValues(t, 7, seq, "a writer's seq at or below a mark is moved above every row")
	checkCounters(t, ob.DB())
}

// markingRelay is an outbox opened with opts, a relay of it that does not
// run, and the relay's connection, holding its lease: marks and parks are
// made by calling the relay's writes, as its loops would.
func markingRelay(t *testing.T, opts Options, ropts RelayOptions) (*Outbox, *Relay, *sqlconn.Conn) {
	t.Helper()
	ob := openTest(t, opts)
	r, err := ob.NewRelay(&fakePublisher{}, ropts)
	require.NoError(t, err)
	rc, err := sqlconn.Open(context.Background(), ob.DB())
	require.NoError(t, err)
	t.Cleanup(rc.Close)
	holdLease(t, r, rc)
	return ob, r, rc
}

// enqueuePriorities commits one message per priority given, in order, in
// one transaction, and returns their seqs.
func enqueuePriorities(t *testing.T, ob *Outbox, prios ...int) []int64 {
	t.Helper()
	ctx := context.Background()
	var before int64
	require.NoError(t, ob.DB().QueryRow(`SELECT coalesce(max(seq), 0) FROM outbox`).Scan(&before))
	msgs := make([]Message, len(prios))
	for i, p := range prios {
		msgs[i] = Message{Topic: "t", Payload: fmt.Appendf(nil, `{"p":%d,"i":%d}`, p, i), Priority: p}
	}
	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }))
	var seqs []int64
	rows, err := ob.DB().Query(`SELECT seq FROM outbox WHERE seq > ? ORDER BY seq`, before)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var s int64
		require.NoError(t, rows.Scan(&s))
		seqs = append(seqs, s)
	}
	require.Len(t, seqs, len(prios))
	return seqs
}

// marksOf are fake acknowledgements of rows of priority p, for markSent.
func marksOf(p uint8, seqs ...int64) []mark {
	ms := make([]mark, len(seqs))
	for i, s := range seqs {
		ms[i] = mark{seq: s, ends: true, priority: p}
	}
	return ms
}

// rowStates is every row's state, as the view says, by seq.
func rowStates(t *testing.T, ob *Outbox) map[int64]string {
	t.Helper()
	rows, err := ob.DB().Query(`SELECT seq, state FROM outbox_messages`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[int64]string{}
	for rows.Next() {
		var s int64
		var st string
		require.NoError(t, rows.Scan(&s, &st))
		out[s] = st
	}
	require.NoError(t, rows.Err())
	return out
}

// checkTruth checks that what the library says agrees with the rows: the
// limits' counters, Stats, Gauges, List, each pending count against the
// rows (the view's state, which the test checks separately). Without a
// message limit Gauges counts a number above the common mark that holds no
// row (a gap) as pending, as documented: gaps says there may be some.
func checkTruth(t *testing.T, ob *Outbox, gaps bool) {
	t.Helper()
	ctx := context.Background()
	checkCounters(t, ob.DB())
	var pending, sent, bytes int64
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'sent'),
		coalesce(sum(length(CAST(payload AS BLOB))) FILTER (WHERE state = 'pending'), 0) FROM outbox_messages`).Scan(&pending, &sent, &bytes))
	st, err := ob.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, pending, st.Pending, "Stats.Pending")
	require.Equal(t, bytes, st.PendingBytes, "Stats.PendingBytes")
	require.Equal(t, sent, st.Sent, "Stats.Sent")
	g, err := ob.Gauges(ctx)
	require.NoError(t, err)
	if gaps {
		require.GreaterOrEqual(t, g.Pending, pending, "Gauges.Pending")
	} else {
		require.Equal(t, pending, g.Pending, "Gauges.Pending")
	}
	if g.PendingBytesKnown {
		require.Equal(t, bytes, g.PendingBytes, "Gauges.PendingBytes")
	}
	list, err := ob.List(ctx, ListOptions{Limit: 100_000})
	require.NoError(t, err)
	require.Equal(t, int(pending), len(list), "List of pending")
	list, err = ob.List(ctx, ListOptions{State: StateSent, Limit: 100_000})
	require.NoError(t, err)
	require.Equal(t, int(sent), len(list), "List of sent")
	for _, r := range list {
		require.False(t, r.SentAt.IsZero(), "a sent row's SentAt, seq %d", r.Seq)
	}
}

// commonMark is outbox_state.sent_seq.
func commonMark(t *testing.T, ob *Outbox) int64 {
	t.Helper()
	var l int64
	require.NoError(t, ob.DB().QueryRow(`SELECT sent_seq FROM outbox_state`).Scan(&l))
	return l
}

// TestMarkPerPriority: a mark of a priority moves only its own rows to sent:
// a priority-9 mark above the common mark leaves the lower priorities'
// rows below it pending; the common mark catches up when the rows below
// are settled; marks of several priorities in one call; the counters, Stats,
// Gauges and List agree with the rows throughout, with limits set and
// without.
func TestMarkPerPriority(t *testing.T) {
	for _, limits := range []bool{true, false} {
		t.Run(fmt.Sprint("limits=", limits), func(t *testing.T) {
			opts := Options{}
			if limits {
				opts = Options{MaxPendingMessages: 1000, MaxPendingBytes: 1 << 20}
			}
			ob, r, rc := markingRelay(t, opts, fastRelay())
			s := enqueuePriorities(t, ob, 0, 0, 9, 0, 3, 9, 0, 0, 3, 0)
			want := map[int64]string{}
			for _, seq := range s {
				want[seq] = "pending"
			}
			// The common mark may lag behind rows sent ahead (a mark whose
			// range was all acknowledged does not look further), never
			// passes a pending row.
			step := func(what string, ms []mark, minL, maxL int64) {
				t.Helper()
				require.NoError(t, r.markSent(rc, ms), what)
				for _, m := range ms {
					want[m.seq] = "sent"
				}
				require.Equal(t, want, rowStates(t, ob), what)
				l := commonMark(t, ob)
				require.True(t, l >= minL && l <= maxL, "%s: the common mark %d, want %d..%d", what, l, minL, maxL)
				checkTruth(t, ob, false)
			}
			step("priority 9 ahead", marksOf(9, s[2], s[5]), 0, 0)
			step("priority 0's first two", marksOf(0, s[0], s[1]), s[1], s[2])
			step("priorities 3 and 0 in one call", append(marksOf(0, s[3], s[6], s[7]), marksOf(3, s[4], s[8])...), s[8], s[8])
			step("the last", marksOf(0, s[9]), s[9], s[9])
			var skipped, pendingBytes int64
			require.NoError(t, ob.DB().QueryRow(`SELECT skipped, pending_bytes FROM outbox_state`).Scan(&skipped, &pendingBytes))
			require.Zero(t, skipped)
			require.Zero(t, pendingBytes)

			recs, err := ob.List(context.Background(), ListOptions{State: StateSent})
			require.NoError(t, err)
			require.Len(t, recs, 10)
			require.Equal(t, 9, recs[2].Priority)
			require.Equal(t, 3, recs[4].Priority)
		})
	}
}

// TestMarkPriorityIntruders: a row of the marked priority that a writer set
// into a gap of the range the relay read past is moved to the end, still
// pending, before the mark; a row of another priority there is left as it
// is, pending, and holds the common mark back.
func TestMarkPriorityIntruders(t *testing.T) {
	ob, r, rc := markingRelay(t, Options{}, fastRelay())
	db := ob.DB()
	_, err := db.Exec(`INSERT INTO outbox (seq, topic, payload, priority) VALUES (1, 't', 'a', 3), (4, 't', 'b', 3), (6, 't', 'c', 3)`)
	require.NoError(t, err)
	// Written behind the relay, which read 1, 4 and 6.
	_, err = db.Exec(`INSERT INTO outbox (seq, topic, payload, priority) VALUES (2, 't', 'other', 0), (5, 't', 'intruder', 3)`)
	require.NoError(t, err)
	require.NoError(t, r.markSent(rc, marksOf(3, 1, 4, 6)))
	var seq int64
	var state string
	require.NoError(t, db.QueryRow(`SELECT seq, state FROM outbox_messages WHERE payload = 'intruder'`).Scan(&seq, &state))
	require.EqualValues(t, 7, seq, "moved above every number used")
	require.Equal(t, "pending", state)
	require.Equal(t, map[int64]string{1: "sent", 2: "pending", 4: "sent", 6: "sent", 7: "pending"}, rowStates(t, ob))
	require.EqualValues(t, 1, commonMark(t, ob), "held back by the pending row of priority 0")
	checkTruth(t, ob, true)
}

// TestMarkCommonMarkCatchesUp: the common mark passes rows sent ahead by
// another priority's mark, many of them, a bounded walk per mark, and never
// passes a pending row.
func TestMarkCommonMarkCatchesUp(t *testing.T) {
	ob, r, rc := markingRelay(t, Options{MaxPendingMessages: 10_000}, fastRelay())
	prios := make([]int, 3+markWalk+64)
	for i := range prios {
		prios[i] = 7
	}
	prios[0], prios[2] = 0, 0
	s := enqueuePriorities(t, ob, prios...)
	last := enqueuePriorities(t, ob, 0)[0]
	var ahead []int64
	for i, p := range prios {
		if p == 7 {
			ahead = append(ahead, s[i])
		}
	}
	for i := 0; i < len(ahead); i += maxMarkBatch {
		require.NoError(t, r.markSent(rc, marksOf(7, ahead[i:min(i+maxMarkBatch, len(ahead))]...)))
		require.Zero(t, commonMark(t, ob), "the first row is pending")
	}
	checkCounters(t, ob.DB())
	require.NoError(t, r.markSent(rc, marksOf(0, s[0], s[2])))
	require.Equal(t, s[2]+markWalk-1, commonMark(t, ob), "one walk's worth past the mark")
	checkCounters(t, ob.DB())
	require.NoError(t, r.markSent(rc, marksOf(0, last)))
	require.Equal(t, last, commonMark(t, ob), "all settled")
	checkTruth(t, ob, false)
}

// TestPriorityEvents: dead, expired, requeue, purge, plain-SQL writes and
// the limits act per event with priorities mixed, a row sent ahead of the
// common mark by its priority's mark counting as sent throughout: the
// counters, Stats, Gauges and List agree with the rows after each event,
// and after the recount of the next Open.
func TestPriorityEvents(t *testing.T) {
	ctx := context.Background()
	for _, limits := range []bool{true, false} {
		t.Run(fmt.Sprint("limits=", limits), func(t *testing.T) {
			opts := Options{}
			if limits {
				opts = Options{MaxPendingMessages: 12, MaxPendingBytes: 1 << 20}
			}
			ob, r, rc := markingRelay(t, opts, fastRelay())
			db := ob.DB()
			// 0 0 9 0 5 9 0 5, then 9 and 5 sent ahead of the first 0.
			s := enqueuePriorities(t, ob, 0, 0, 9, 0, 5, 9, 0, 5)
			require.NoError(t, r.markSent(rc, append(marksOf(9, s[2], s[5]), marksOf(5, s[4])...)))
			checkTruth(t, ob, false)
			state := func(seq int64) string {
				st, _ := rowState(t, ob, seq)
				return st
			}
			// Without a message limit, Gauges counts the gaps deleted and
			// requeued rows leave above the common mark until it passes.
			gaps := false
			event := func(what string, fn func()) {
				t.Helper()
				fn()
				checkTruth(t, ob, gaps)
			}

			event("an attempt charged to a row sent ahead: none", func() {
				_, _, found, err := r.charge(rc, s[2], errors.New("refused"))
				require.NoError(t, err)
				require.False(t, found, "a sent row is not charged")
				_, attempts := rowState(t, ob, s[2])
				require.Zero(t, attempts)
			})
			event("a pending row parked dead", func() {
				require.NoError(t, r.park(rc, parking{seq: s[3], reason: "refused", charge: true}))
				require.Equal(t, "dead", state(s[3]))
			})
			event("a pending row of priority 5 parked expired", func() {
				require.NoError(t, r.park(rc, parking{seq: s[7], reason: "expired", expired: true}))
				require.Equal(t, "expired", state(s[7]))
			})
			event("a row sent ahead set dead by hand", func() {
				_, err := db.Exec(`UPDATE outbox SET dead_at = 1 WHERE seq = ?`, s[5])
				require.NoError(t, err)
			})
			event("and brought back in place", func() {
				_, err := db.Exec(`UPDATE outbox SET dead_at = NULL WHERE seq = ?`, s[5])
				require.NoError(t, err)
				require.Equal(t, "sent", state(s[5]), "still at or below its priority's mark")
			})
			event("a payload changed on a row sent ahead and on a pending row", func() {
				_, err := db.Exec(`UPDATE outbox SET payload = 'longer than before, by far' WHERE seq IN (?, ?)`, s[2], s[1])
				require.NoError(t, err)
			})
			event("a row sent ahead deleted by hand", func() {
				_, err := db.Exec(`DELETE FROM outbox WHERE seq = ?`, s[2])
				require.NoError(t, err)
				gaps = !limits
			})
			event("requeued", func() {
				n, err := ob.RequeueDead(ctx)
				require.NoError(t, err)
				require.EqualValues(t, 1, n)
				n, err = ob.RequeueExpired(ctx)
				require.NoError(t, err)
				require.EqualValues(t, 1, n)
			})
			requeued := enqueuePriorities(t, ob, 9) // and one more, above them
			event("marks of all three, past the requeued rows", func() {
				var rows []mark
				for _, q := range []uint8{0, 5, 9} {
					var seqs []int64
					rs, err := db.Query(`SELECT seq FROM outbox_messages WHERE state = 'pending' AND priority = ? ORDER BY seq`, q)
					require.NoError(t, err)
					for rs.Next() {
						var seq int64
						require.NoError(t, rs.Scan(&seq))
						seqs = append(seqs, seq)
					}
					require.NoError(t, rs.Err())
					rs.Close()
					rows = append(rows, marksOf(q, seqs...)...)
				}
				require.NoError(t, r.markSent(rc, rows))
				require.Zero(t, countState(t, ob, "pending"))
				require.Equal(t, requeued[0], commonMark(t, ob))
				gaps = false
			})
			event("purged", func() {
				_, err := ob.PurgeSent(ctx, time.Now().Add(time.Hour))
				require.NoError(t, err)
				require.Zero(t, countState(t, ob, "sent"))
			})
			if limits {
				event("filled to the limit, by priorities", func() {
					prios := make([]int, 12)
					for i := range prios {
						prios[i] = i % 3 * 4
					}
					enqueuePriorities(t, ob, prios...)
					err := ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, Message{Topic: "t", Priority: 9}) })
					require.ErrorIs(t, err, ErrFull)
					_, err = db.Exec(`INSERT INTO outbox (topic, payload, priority) VALUES ('t', 'x', 9)`)
					require.ErrorContains(t, err, "outbox full")
				})
				event("room made by a mark of priority 8 ahead", func() {
					var seq int64
					require.NoError(t, db.QueryRow(`SELECT max(seq) FROM outbox WHERE priority = 8`).Scan(&seq))
					require.NoError(t, r.markSent(rc, marksOf(8, seq)))
					require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, Message{Topic: "t", Priority: 9}) }))
				})
			}
			// The next Open counts again: the same figures.
			rc.Close()
			path := dbPath(t, ob)
			require.NoError(t, ob.Close())
			checkTruth(t, openTestPath(t, path, opts), false)
		})
	}
}

// TestPurgeSentPerPriority: a purge cuts each priority at its own marks:
// rows of priority 0 still pending below a mark of priority 9 stay, and
// sent rows of each priority go once their own mark is old enough.
func TestPurgeSentPerPriority(t *testing.T) {
	ctx := context.Background()
	ob, r, rc := markingRelay(t, Options{MaxPendingMessages: 100}, fastRelay())
	s := enqueuePriorities(t, ob, 0, 0, 9, 0, 9)
	require.NoError(t, r.markSent(rc, marksOf(9, s[2], s[4])))
	require.NoError(t, r.markSent(rc, marksOf(0, s[0])))
	n, err := ob.PurgeSent(ctx, time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	require.Equal(t, map[int64]string{s[1]: "pending", s[3]: "pending"}, rowStates(t, ob))
	checkTruth(t, ob, false)
	var logged int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox_sent_log`).Scan(&logged))
	require.Equal(t, 2, logged, "each priority's newest mark kept")
}

// TestRetentionNegativeWithPriorities: with a negative Retention each mark
// deletes the rows it made sent, of its priority, and never a pending row
// of another.
func TestRetentionNegativeWithPriorities(t *testing.T) {
	ropts := fastRelay()
	ropts.Retention = -1
	ob, r, rc := markingRelay(t, Options{MaxPendingMessages: 100, MaxPendingBytes: 1 << 20}, ropts)
	s := enqueuePriorities(t, ob, 0, 0, 9, 0, 9, 4)
	require.NoError(t, r.markSent(rc, marksOf(9, s[2], s[4])))
	require.Equal(t, map[int64]string{s[0]: "pending", s[1]: "pending", s[3]: "pending", s[5]: "pending"}, rowStates(t, ob))
	checkTruth(t, ob, false)
	require.NoError(t, r.markSent(rc, append(marksOf(0, s[0], s[1]), marksOf(4, s[5])...)))
	require.Equal(t, map[int64]string{s[3]: "pending"}, rowStates(t, ob))
	checkTruth(t, ob, false)
}

// TestPriorityStatementsSeek: the statements that look for rows of one
// priority above 0 seek the outbox_priority index (SQLite uses the partial
// index only when the WHERE has its terms literally), and those of priority
// 0 read a range of seq: none reads the whole table.
func TestPriorityStatementsSeek(t *testing.T) {
	ob, r, _ := markingRelay(t, Options{}, fastRelay())
	args := append([]any{int64(1), int64(1), 1}, r.lease.HeldArgs()...)
	plan := func(q string, args ...any) string {
		t.Helper()
		rows, err := ob.DB().Query(`EXPLAIN QUERY PLAN `+q, args...)
		require.NoError(t, err, q)
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			var id, parent, notused int
			var detail string
			require.NoError(t, rows.Scan(&id, &parent, &notused, &detail))
			b.WriteString(detail + "\n")
		}
		require.NoError(t, rows.Err())
		return b.String()
	}
	noScan := func(what, p string) {
		t.Helper()
		for _, line := range strings.Split(p, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "SCAN outbox") && !strings.Contains(line, "outbox_") {
				t.Errorf("%s reads the whole table:\n%s", what, p)
			}
		}
	}
	for p := 0; p <= MaxPriority; p++ {
		noScan(fmt.Sprint("fast mark ", p), plan(fastMarkSQLs[p], args...))
		got := plan(markSQLs[p], args...)
		noScan(fmt.Sprint("mark ", p), got)
		require.GreaterOrEqual(t, strings.Count(got, "USING INDEX outbox_priority (priority=? AND seq>?)"), MaxPriority,
			"mark %d: a seek per priority above 0 for its first pending row:\n%s", p, got)
		got = plan(deleteSentSQLs[p])
		noScan(fmt.Sprint("delete ", p), got)
		if p > 0 {
			require.Contains(t, got, "USING INDEX outbox_priority", "delete %d", p)
		}
	}
	noScan("sent kept", plan(sentKeptSQL))
	noScan("charge", plan(chargeSQL, append([]any{"why", int64(1)}, r.lease.HeldArgs()...)...))
	got := plan(`SELECT ` + sentAheadSQL + ` FROM outbox_state st`)
	noScan("sent ahead", got)
	require.Equal(t, MaxPriority, strings.Count(got, "USING INDEX outbox_priority"), got)
}

// TestPickStatementSeeks: the pick seeks each priority above 0, and finds
// priority 0 by counting in the indexes, not by reading the rows, past a
// short walk.
func TestPickStatementSeeks(t *testing.T) {
	ob, _, _ := markingRelay(t, Options{}, fastRelay())
	args := make([]any, MaxPriority+1)
	for i := range args {
		args[i] = int64(0)
	}
	rows, err := ob.DB().Query(`EXPLAIN QUERY PLAN `+pickSQL, args...)
	require.NoError(t, err)
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, parent, notused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &notused, &detail))
		b.WriteString(detail + "\n")
	}
	require.NoError(t, rows.Err())
	got := b.String()
	// The exists of each priority above 0, and its count for priority 0.
	require.Equal(t, 2*MaxPriority, strings.Count(got, "USING INDEX outbox_priority (priority=? AND seq>?)"), got)
	require.Contains(t, got, "USING INDEX outbox_dead (seq>?)", got)
}

// TestPickFindsPriority0: the pick says whether a row of priority 0 is
// pending after its cursor — within its short walk, past it by counting,
// and past a gap (where counting cannot tell) by reading on — and not for
// a dead one.
func TestPickFindsPriority0(t *testing.T) {
	ob, r, rc := markingRelay(t, Options{}, fastRelay())
	ctx := context.Background()
	pick0 := func() bool {
		t.Helper()
		var cur [MaxPriority + 1]int64
		_, _, pending, done, err := r.pick(ctx, rc, &cur, true)
		require.NoError(t, err)
		require.True(t, done)
		return pending&1 != 0
	}
	nines := make([]int, 2*pick0Walk)
	for i := range nines {
		nines[i] = 9
	}
	enqueuePriorities(t, ob, nines...)
	require.False(t, pick0(), "only priority 9")
	s := enqueuePriorities(t, ob, 0)
	require.True(t, pick0(), "a priority-0 row past the walk")
	_, err := ob.DB().Exec(`UPDATE outbox SET dead_at = 1 WHERE seq = ?`, s[0])
	require.NoError(t, err)
	require.False(t, pick0(), "its row dead")
	// A gap: the counts cannot tell, and the rows are read.
	_, err = ob.DB().Exec(`DELETE FROM outbox WHERE seq = ?`, s[0]-1)
	require.NoError(t, err)
	require.False(t, pick0(), "a gap, and no priority-0 row")
	enqueuePriorities(t, ob, 0)
	require.True(t, pick0(), "a gap, and a priority-0 row")
}
