package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeoutbox/outbox/internal/lease"
	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// The marks: acknowledged messages are recorded as sent by moving a
// high-water mark, many per statement, on the relay's own connection.

const (
	// maxMarkBatch bounds the acknowledgements recorded in one mark.
	maxMarkBatch = 512
	// minMarkSlots is the least room for acknowledged messages not yet
	// recorded: a mark takes about as long as a loopback round trip, so
	// with a window of 1 the next acknowledgements must be able to queue
	// behind it. It also bounds how far the marks may run ahead of the
	// WAL's last fsync (internal/durable's Gate: Window + markSlots), and
	// so sets how often they are fsynced: too few slots make a small
	// window sync every few messages and drain at a fraction of the link's
	// rate (BENCHMARKS.md). A crash or a cut then duplicates at most
	// Window + 256 messages at small windows. Where an fsync takes
	// milliseconds (an SD card), the bound caps the drain: each sync covers
	// at most the bound less the messages in flight and those awaiting
	// their mark.
	minMarkSlots = 256
	// markDelay is how long a mark waits for more acknowledgements when
	// few are queued.
	markDelay = time.Millisecond
)

// mark is an acknowledged row for the mark loop; ends says it is the last
// row of its MQTT message, which the mark then settles (durable.Gate
// counts messages); priority is the row's, whose mark it moves.
type mark struct {
	seq      int64
	ends     bool
	priority uint8
}

// markSlots is how many acknowledged messages may wait for their mark.
func markSlots(window int) int { return max(window, minMarkSlots) }

// markLoop records acknowledged messages as sent, many per statement.
func (s *session) markLoop() {
	r := s.r
	batch := make([]mark, 0, maxMarkBatch)
	ends := int64(0) // messages the batch settles
	// A mark costs about the same however many messages it records
	// (BenchmarkMarkSent64): when few acknowledgements are queued, wait a
	// moment for more, so that a fast stream is recorded in batches, not
	// one mark per PUBACK. The wait is one sleep, not a receive per
	// acknowledgement: acknowledgements that trickle in (a broker's, one
	// or a few per read) woke this goroutine once each. Nothing waits on a
	// mark but the unmarked slots, of which half stay free.
	enough := max(cap(s.unmarked)/2, 1)
	add := func(m mark) {
		batch = append(batch, m)
		if m.ends {
			ends++
		}
	}
	// gather adds the marks queued, up to maxMarkBatch.
	gather := func() {
		for len(batch) < maxMarkBatch {
			select {
			case m, ok := <-s.marks:
				if !ok {
					return
				}
				add(m)
			default:
				return
			}
		}
	}
	for m := range s.marks {
		batch, ends = batch[:0], 0
		add(m)
		gather()
		if len(batch) < enough {
			time.Sleep(markDelay)
			gather()
		}
		for attempt := 0; ; attempt++ {
			// Marks arrive in sequence order within each priority, and
			// only while nothing before them failed: everything of a
			// priority up to its last is settled.
			err := r.markSent(s.conn, batch)
			if err == nil {
				s.gate.Settle(ends)
				if r.diskFull.Load() {
					r.wakePurge()
				}
				break
			}
			if r.markFailed(err) {
				continue // space was freed: try again at once
			}
			if errors.Is(err, ErrLeaseLost) {
				// The relay stops (keepLease); the rows stay pending for
				// the relay that holds the lease now.
				break
			}
			r.log.Error("outbox relay cannot mark messages sent", "err", err, "rows", len(batch))
			if s.ctx.Err() != nil && attempt >= 3 {
				// Shutting down: the rows stay pending and are sent again
				// by the next relay (a duplicate, never a loss).
				break
			}
			time.Sleep(min(time.Duration(attempt+1)*100*time.Millisecond, 2*time.Second))
		}
		n := int64(len(batch))
		r.inFlight.Add(-n)
		for range batch {
			<-s.unmarked
		}
	}
}

// markSQLs[p] is the mark of priority p: one statement on one row, whatever
// the batch's size; a trigger logs when. ?1 is the seq up to which every
// message of priority p is settled, ?3 how many of them were acknowledged
// since p's last mark. It is made when fastMarkSQLs[p], tried first, was
// not.
//
// It sets p's mark, and raises seq_floor to it (a new row is numbered above
// every mark), and moves the common mark, sent_seq, up to just below the
// first pending row of any priority. That search is a seek per priority
// above 0 in the outbox_priority index, then a walk by seq from the common
// mark (or priority 0's, if higher) for the first pending row of priority 0,
// which stops at the others' first and after markWalk numbers: the common
// mark may lag (that is conservative, and the next mark goes on), but a
// mark never reads more than that many rows.
//
// Pending bytes are counted only while a byte limit is set, the numbers
// that hold no pending message only while a message limit is: p's live rows
// just marked leave the pending count (skipped grows by them) and the
// numbers the common mark passes leave the range it is counted over
// (skipped shrinks by them); a mark after which nothing is pending leaves
// both at 0, which puts right a pending row an INSERT OR REPLACE deleted
// without a DELETE trigger (schema/outbox.sql). The counts are over p's
// range only: index seeks for a priority above 0; for priority 0, the
// numbers in the range less its dead rows (the outbox_dead index) and the
// live rows of the other priorities (seeks), so that no row is read.
//
// The mark is not made when p's range holds more live rows of p than were
// acknowledged: a writer set a seq into a gap the relay had read past (the
// insert looks for that only while a limit is set), and the mark would take
// that row as sent. markSent moves it to the end first. A range whose every
// number was acknowledged (the common case with one priority) has no room
// for such a row, and is not counted.
//
// Nor is it made once the lease is another relay's (lease.HeldSQL, its
// arguments after ?3): a relay stopped while its PUBACKs came would record
// as sent what its successor is sending.
//
// The subqueries in FROM end in LIMIT 1 so that SQLite does not flatten
// them, which would evaluate their seeks once per use.
var markSQLs = func() (q [MaxPriority + 1]string) {
	for p := range q {
		q[p] = markSQLFor(p)
	}
	return q
}()

// fastMarkSQLs[p] is the mark of priority p where p's range starts at the
// common mark and every number in it was acknowledged: the common case, and
// the only one with priority 0 alone. Those numbers are all p's settled
// rows, so the common mark moves with p's to ?1 with no search (and may lag
// behind rows of other priorities sent ahead, until a mark of markSQLs
// passes them); the counts are markSQLs', over the range. It changes
// nothing in any other case, at the cost of a comparison.
var fastMarkSQLs = func() (q [MaxPriority + 1]string) {
	for p := range q {
		q[p] = `UPDATE outbox_state SET
	pending_bytes = CASE WHEN max_pending_bytes = 0 OR ?1 >= coalesce((SELECT max(seq) FROM outbox), 0) THEN 0
		ELSE max(pending_bytes - (SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM outbox
			WHERE seq > outbox_state.sent_seq AND seq <= ?1 AND dead_at IS NULL), 0) END,
	skipped = CASE WHEN max_pending_count = 0 THEN 0
		WHEN ?1 >= coalesce((SELECT max(seq) FROM outbox), 0) THEN max(seq_floor - ?1, 0)
		ELSE max(skipped - (?1 - sent_seq)
			+ (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND seq <= ?1)
			- (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND seq <= ?1 AND dead_at IS NOT NULL), 0) END,
	sent_seq = ?1, sent_seq_` + strconv.Itoa(p) + ` = ?1, seq_floor = max(seq_floor, ?1), sent_at = ?2
WHERE id = 1 AND sent_seq < ?1 AND sent_seq >= sent_seq_` + strconv.Itoa(p) + ` AND ?1 - sent_seq <= ?3
	AND ` + lease.HeldSQL
	}
	return q
}()

// markWalk bounds the numbers a mark walks for priority 0's first pending
// row.
const markWalk = 1024

// noSeq stands for "no pending row" in the mark's search for the first.
const noSeq = "9223372036854775807"

func markSQLFor(p int) string {
	// Each priority's mark as it will be: ?1 for p.
	markOf := func(q int) string {
		if q == p {
			return "?1"
		}
		return "s.sent_seq_" + strconv.Itoa(q)
	}
	var firsts []string
	for q := 1; q <= MaxPriority; q++ {
		firsts = append(firsts, `coalesce((SELECT seq FROM outbox WHERE priority = `+strconv.Itoa(q)+` AND priority > 0 AND dead_at IS NULL
				AND seq > max(s.sent_seq, `+markOf(q)+`) ORDER BY seq LIMIT 1), `+noSeq+`)`)
	}
	// p's live rows in (x.a, ?1]: what the mark settles.
	inRange := `seq > x.a AND seq <= ?1`
	live := `priority = ` + strconv.Itoa(p) + ` AND priority > 0 AND dead_at IS NULL AND ` + inRange
	count := `(SELECT count(*) FROM outbox WHERE ` + live + `)`
	if p == 0 {
		live = inRange + ` AND priority = 0 AND dead_at IS NULL`
		count = `((SELECT count(*) FROM outbox WHERE ` + inRange + `)
				- (SELECT count(*) FROM outbox WHERE ` + inRange + ` AND dead_at IS NOT NULL)`
		for q := 1; q <= MaxPriority; q++ {
			count += `
				- (SELECT count(*) FROM outbox WHERE priority = ` + strconv.Itoa(q) + ` AND priority > 0 AND dead_at IS NULL AND ` + inRange + `)`
		}
		count += `)`
	}
	return `UPDATE outbox_state SET
	pending_bytes = CASE WHEN max_pending_bytes = 0 OR y.l >= y.top THEN 0
		ELSE max(pending_bytes - (SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM outbox
			WHERE ` + strings.ReplaceAll(live, "x.a", "y.a") + `), 0) END,
	skipped = CASE WHEN max_pending_count = 0 OR y.l >= y.top THEN 0
		ELSE max(skipped + y.k - (y.l - sent_seq), 0) END,
	sent_seq = y.l, sent_seq_` + strconv.Itoa(p) + ` = ?1, seq_floor = max(seq_floor, ?1), sent_at = ?2
FROM (SELECT x.a, x.top,
		CASE WHEN x.count_limit OR ?1 - x.a > ?3 THEN ` + count + ` END AS k,
		min(coalesce((SELECT seq FROM outbox WHERE seq > x.a0 AND seq < min(x.bound, x.a0 + ` + strconv.Itoa(markWalk) + `)
				AND priority = 0 AND dead_at IS NULL ORDER BY seq LIMIT 1),
			min(x.bound, x.a0 + ` + strconv.Itoa(markWalk) + `)) - 1, x.top) AS l
	FROM (SELECT max(s.sent_seq, s.sent_seq_` + strconv.Itoa(p) + `) AS a, max(s.sent_seq, ` + markOf(0) + `) AS a0,
			max(coalesce((SELECT max(seq) FROM outbox), 0), s.seq_floor, s.sent_seq, ?1) AS top,
			s.max_pending_count > 0 AS count_limit,
			min(` + strings.Join(firsts, `,
				`) + `) AS bound
		FROM outbox_state s WHERE s.id = 1 LIMIT 1) x LIMIT 1) y
WHERE id = 1 AND ?1 > y.a
	AND (?1 - y.a <= ?3 OR y.k <= ?3)
	AND ` + lease.HeldSQL
}

// markSent records that every message of each priority in acked up to and
// including its last there is settled; acked are the messages acknowledged
// since the last mark, in order within each priority (priorities may mix).
// One priority is one statement; several are made in one transaction. With
// a negative Retention the sent rows are then deleted.
func (r *Relay) markSent(conn *sqlconn.Conn, acked []mark) error {
	var last [MaxPriority + 1]int64
	var count [MaxPriority + 1]int
	marked := 0 // priorities in acked
	for _, m := range acked {
		if count[m.priority] == 0 {
			marked++
		}
		last[m.priority] = m.seq
		count[m.priority]++
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := conn.Do(func(c *sql.Conn) error {
		if marked == 1 {
			p := acked[0].priority
			if err := r.markPriority(ctx, conn, c, p, last[p], count[p], acked, false); err != nil {
				return err
			}
		} else if err := r.markPriorities(ctx, conn, c, acked, &last, &count); err != nil {
			return err
		}
		if r.opts.Retention < 0 {
			// Not atomic with the mark, and need not be: rows left by a
			// crash in between are sent, and the purge takes them.
			return deleteSent(ctx, conn, c, &count)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("outbox: mark sent: %w", classifyWriteErr(err))
	}
	r.sent.Add(int64(len(acked)))
	r.metrics.writeFailed.Store(false)
	r.mu.Lock()
	r.lastAck = r.ob.now()
	r.mu.Unlock()
	return nil
}

// deleteSentSQLs[p] deletes the sent rows, for a negative Retention: [0]
// those up to the common mark, a range; [p] those of priority p above 0
// sent ahead of it, a seek in the outbox_priority index. A row of priority
// 0 sent ahead of the common mark waits for it to pass.
var deleteSentSQLs = func() (q [MaxPriority + 1]string) {
	q[0] = `DELETE FROM outbox WHERE seq <= (SELECT sent_seq FROM outbox_state WHERE id = 1) AND dead_at IS NULL`
	for p := 1; p <= MaxPriority; p++ {
		q[p] = `DELETE FROM outbox WHERE ` + liveOfSQL(p) + `
			AND seq <= (SELECT sent_seq_` + strconv.Itoa(p) + ` FROM outbox_state WHERE id = 1)`
	}
	return q
}()

// deleteSent deletes the sent rows up to the common mark and those of the
// priorities above 0 just marked.
func deleteSent(ctx context.Context, conn *sqlconn.Conn, c *sql.Conn, count *[MaxPriority + 1]int) error {
	for p, q := range deleteSentSQLs {
		if p == 0 || count[p] > 0 {
			if err := conn.ExecPolling(ctx, c, q); err != nil {
				return err
			}
		}
	}
	return nil
}

// markPriorities makes the marks of several priorities in one transaction.
func (r *Relay) markPriorities(ctx context.Context, conn *sqlconn.Conn, c *sql.Conn, acked []mark, last *[MaxPriority + 1]int64, count *[MaxPriority + 1]int) error {
	if err := conn.ExecPolling(ctx, c, `BEGIN IMMEDIATE`); err != nil {
		return err
	}
	err := func() error {
		for p := MaxPriority; p >= 0; p-- {
			if count[p] == 0 {
				continue
			}
			if err := r.markPriority(ctx, conn, c, uint8(p), last[p], count[p], acked, true); err != nil {
				return err
			}
		}
		return nil
	}()
	return endTx(ctx, c, err)
}

// markPriority makes the mark of priority p up to seq, of n acknowledged
// messages: the fast statement, else the full one, else the slow road
// (inTx: within markPriorities' transaction). The statements are prepared
// once per connection: markSQLs' take longer to prepare than to run. The
// fast one is not tried when p's acknowledged numbers have gaps, which it
// never marks: as a statement of its own, even one that changes nothing
// takes the write lock, and cost about half a mark.
func (r *Relay) markPriority(ctx context.Context, conn *sqlconn.Conn, c *sql.Conn, p uint8, seq int64, n int, acked []mark, inTx bool) error {
	args := r.markArgs(seq, n)
	var marked int64
	var err error
	if first := firstOf(acked, p); seq-first+1 == int64(n) {
		marked, err = conn.ExecPollingCount(ctx, c, fastMarkSQLs[p], args...)
	}
	if err == nil && marked == 0 {
		marked, err = conn.ExecPollingCount(ctx, c, markSQLs[p], args...)
	}
	if err != nil || marked > 0 {
		return err
	}
	return r.markPastIntruders(ctx, conn, c, p, acked, inTx)
}

// firstOf is the seq of the first of acked of priority p (acked holds one).
func firstOf(acked []mark, p uint8) int64 {
	for _, m := range acked {
		if m.priority == p {
			return m.seq
		}
	}
	return 0
}

// endTx commits a transaction, or rolls it back after err.
func endTx(ctx context.Context, c *sql.Conn, err error) error {
	if err == nil {
		_, err = c.ExecContext(ctx, `COMMIT`)
	}
	if err != nil {
		c.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
	}
	return err
}

// markArgs are a mark's arguments for a mark up to seq of n messages.
func (r *Relay) markArgs(seq int64, n int) []any {
	return append([]any{seq, r.ob.now().UnixMilli(), n}, r.lease.HeldArgs()...)
}

// markPastIntruders is markSent's slow road, for a mark of priority p that
// markSQLs[p] did not make: the lease is gone (ErrLeaseLost), the mark was
// already made (nothing to do), or p's range holds rows of p the relay never
// read. Those are moved above every number used, as the insert moves a row
// it catches, and are published in their turn; then the mark is made, in
// the same transaction (inTx: the caller's), so no writer comes in between.
func (r *Relay) markPastIntruders(ctx context.Context, conn *sqlconn.Conn, c *sql.Conn, p uint8, acked []mark, inTx bool) error {
	var seqs []int64 // p's acknowledged rows, in order
	for _, m := range acked {
		if m.priority == p {
			seqs = append(seqs, m.seq)
		}
	}
	seq, n := seqs[len(seqs)-1], len(seqs)
	if !inTx {
		if err := conn.ExecPolling(ctx, c, `BEGIN IMMEDIATE`); err != nil {
			return err
		}
	}
	err := func() error {
		// Not made because the lease is gone? Then nothing is moved either.
		if err := r.leaseGone(ctx, c); err != nil {
			return err
		}
		rows, err := c.QueryContext(ctx, `SELECT seq FROM outbox
			WHERE `+liveOfSQL(int(p))+` AND seq > (SELECT max(sent_seq, `+markOfSQL(strconv.Itoa(int(p)), "outbox_state")+`)
				FROM outbox_state WHERE id = 1) AND seq <= ? ORDER BY seq`, seq)
		if err != nil {
			return err
		}
		var intruders []int64
		for rows.Next() {
			var s int64
			if err := rows.Scan(&s); err != nil {
				rows.Close()
				return err
			}
			if _, ok := slices.BinarySearch(seqs, s); !ok {
				intruders = append(intruders, s)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, s := range intruders {
			// Its old number stays a gap, skipped while a message limit
			// is set; the new one at the end is pending: the count holds.
			if _, err := c.ExecContext(ctx, `UPDATE outbox SET seq = (SELECT 1 + max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq)
				FROM outbox_state WHERE id = 1) WHERE seq = ?`, s); err != nil {
				return err
			}
			if _, err := c.ExecContext(ctx, `UPDATE outbox_state SET skipped = skipped + 1 WHERE id = 1 AND max_pending_count > 0`); err != nil {
				return err
			}
			r.log.Warn("outbox row written behind the relay (a seq set into a gap) moved to the end", "seq", s, "priority", p)
		}
		return conn.ExecPolling(ctx, c, markSQLs[p], r.markArgs(seq, n)...)
	}()
	if inTx {
		return err
	}
	return endTx(ctx, c, err)
}
