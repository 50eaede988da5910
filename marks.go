package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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
	// markDelay is the longest a mark waits for more acknowledgements.
	markDelay = time.Millisecond
)

// mark is an acknowledged row for the mark loop; ends says it is the last
// row of its MQTT message, which the mark then settles (durable.Gate
// counts messages).
type mark struct {
	seq  int64
	ends bool
}

// markSlots is how many acknowledged messages may wait for their mark.
func markSlots(window int) int { return max(window, minMarkSlots) }

// markLoop records acknowledged messages as sent, many per statement.
func (s *session) markLoop() {
	r := s.r
	batch := make([]int64, 0, maxMarkBatch)
	ends := int64(0) // messages the batch settles
	// A mark costs about the same however many messages it records
	// (BenchmarkMarkSent64): when few acknowledgements are queued, wait a
	// moment for more, so that a fast stream is recorded in batches, not
	// one mark per PUBACK. Nothing waits on a mark but the unmarked slots,
	// of which half stay free.
	enough := max(cap(s.unmarked)/2, 1)
	wait := time.NewTimer(0)
	defer wait.Stop()
	add := func(m mark) {
		batch = append(batch, m.seq)
		if m.ends {
			ends++
		}
	}
	for m := range s.marks {
		batch, ends = batch[:0], 0
		add(m)
		wait.Reset(markDelay)
	more:
		for len(batch) < maxMarkBatch {
			select {
			case m, ok := <-s.marks:
				if !ok {
					break more
				}
				add(m)
				continue
			default:
			}
			if len(batch) >= enough {
				break
			}
			select {
			case m, ok := <-s.marks:
				if !ok {
					break more
				}
				add(m)
			case <-wait.C:
				break more
			}
		}
		wait.Stop()
		for attempt := 0; ; attempt++ {
			// Marks arrive in sequence order and only while nothing
			// before them failed: everything up to the last is settled.
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

// markSQL is the mark: one statement on one row, whatever the batch's
// size; a trigger logs when. ?1 is the seq up to which everything is
// settled, ?3 how many of the rows after the last mark were acknowledged.
//
// Pending bytes are counted only while a byte limit is set, the numbers
// that hold no pending message only while a message limit is: those the
// mark passes leave the count, and a mark that passes every row leaves
// nothing pending, which puts right a pending row an INSERT OR REPLACE
// deleted without a DELETE trigger (schema/outbox.sql). All are counts
// over the rows just acknowledged; count(*) over a range of seq reads no
// column, and the dead ones are in the outbox_dead index.
//
// The mark is not made when the range holds more live rows than were
// acknowledged: a writer set a seq into a gap the relay had read past
// (the insert looks for that only while a limit is set), and the mark would
// take that row as sent. markSent moves it to the end first. A range whose
// every number was acknowledged (no dead rows, no gaps: the common case)
// has no room for such a row, and is not counted.
//
// Nor is it made once the lease is another relay's (lease.HeldSQL, its
// arguments after ?3): a relay stopped while its PUBACKs came would record
// as sent what its successor is sending.
const markSQL = `UPDATE outbox_state SET
	pending_bytes = CASE WHEN max_pending_bytes = 0 OR ?1 >= coalesce((SELECT max(seq) FROM outbox), 0) THEN 0
		ELSE max(pending_bytes - (SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM outbox
			WHERE seq > outbox_state.sent_seq AND seq <= ?1 AND dead_at IS NULL), 0) END,
	skipped = CASE WHEN max_pending_count = 0 THEN 0
		WHEN ?1 >= coalesce((SELECT max(seq) FROM outbox), 0) THEN max(seq_floor - ?1, 0)
		ELSE max(skipped - (?1 - sent_seq)
			+ (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND seq <= ?1)
			- (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND seq <= ?1 AND dead_at IS NOT NULL), 0) END,
	sent_seq = ?1, sent_seq_0 = ?1, seq_floor = max(seq_floor, ?1), sent_at = ?2
WHERE id = 1 AND sent_seq < ?1
	AND (?1 - sent_seq <= ?3
		OR (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND seq <= ?1)
			- (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND seq <= ?1 AND dead_at IS NOT NULL) <= ?3)
	AND ` + lease.HeldSQL

// markSent records that every message up to and including the last of
// acked is settled; acked are the messages acknowledged since the last
// mark, in order. With a negative Retention the sent rows are then deleted.
func (r *Relay) markSent(conn *sqlconn.Conn, acked []int64) error {
	seq, n := acked[len(acked)-1], len(acked)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := conn.Do(func(c *sql.Conn) error {
		marked, err := conn.ExecPollingCount(ctx, c, markSQL, r.markArgs(seq, n)...)
		if err != nil {
			return err
		}
		if marked == 0 {
			if err := r.markPastIntruders(ctx, conn, c, acked); err != nil {
				return err
			}
		}
		if r.opts.Retention < 0 {
			// Not atomic with the mark, and need not be: rows left by a
			// crash in between are sent, and the purge takes them.
			return conn.ExecPolling(ctx, c, `DELETE FROM outbox WHERE seq <= ? AND dead_at IS NULL`, seq)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("outbox: mark sent: %w", classifyWriteErr(err))
	}
	r.sent.Add(int64(n))
	r.metrics.writeFailed.Store(false)
	r.mu.Lock()
	r.lastAck = r.ob.now()
	r.mu.Unlock()
	return nil
}

// markArgs are markSQL's arguments for a mark up to seq of n messages.
func (r *Relay) markArgs(seq int64, n int) []any {
	return append([]any{seq, r.ob.now().UnixMilli(), n}, r.lease.HeldArgs()...)
}

// markPastIntruders is markSent's slow road, for a mark markSQL did not
// make: the lease is gone (ErrLeaseLost), the mark was already made
// (nothing to do), or the range holds rows the relay never read. Those are
// moved above every number used, as the insert moves a row it catches, and
// are published in their turn; then the mark is made, in the same
// transaction, so no writer comes in between.
func (r *Relay) markPastIntruders(ctx context.Context, conn *sqlconn.Conn, c *sql.Conn, acked []int64) error {
	seq, n := acked[len(acked)-1], len(acked)
	if err := conn.ExecPolling(ctx, c, `BEGIN IMMEDIATE`); err != nil {
		return err
	}
	err := func() error {
		// Not made because the lease is gone? Then nothing is moved either.
		if err := r.leaseGone(ctx, c); err != nil {
			return err
		}
		rows, err := c.QueryContext(ctx, `SELECT seq FROM outbox
			WHERE seq > (SELECT sent_seq FROM outbox_state WHERE id = 1) AND seq <= ? AND dead_at IS NULL ORDER BY seq`, seq)
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
			if _, ok := slices.BinarySearch(acked, s); !ok {
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
			r.log.Warn("outbox row written behind the relay (a seq set into a gap) moved to the end", "seq", s)
		}
		_, err = c.ExecContext(ctx, markSQL, r.markArgs(seq, n)...)
		return err
	}()
	if err != nil {
		c.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		return err
	}
	if _, err := c.ExecContext(ctx, `COMMIT`); err != nil {
		c.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		return err
	}
	return nil
}
