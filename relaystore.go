package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// maxBatchBytes bounds the payload bytes read per batch, so a backlog of
// large messages never sits in memory at once.
const maxBatchBytes = 4 << 20

// row is an outbox row read for publishing, already encoded.
type row struct {
	outgoing
	wire   []byte
	props  PublishProperties // MQTT 5 only: given when the session carries them
	encErr error
	// expires is when the message expires, on the outbox clock (NULL:
	// never).
	expires sql.NullInt64
}

// rowBatch is a batch read as durable.Commits sees it.
type rowBatch []row

func (b rowBatch) Len() int                         { return len(b) }
func (b rowBatch) Row(i int) (seq int64, id string) { return b[i].seq, b[i].id }

// fetch reads up to limit pending rows after cursor, with the data_version
// read before them (so a commit after the read is never missed), encoded
// for a connection that carries MQTT 5 properties or not (carries).
func (r *Relay) fetch(ctx context.Context, conn *sqlconn.Conn, cursor int64, limit int, carries bool) (int64, []row, error) {
	var version int64
	var out []row
	err := conn.Do(func(c *sql.Conn) error {
		dv, err := conn.Stmt(ctx, c, `PRAGMA data_version`)
		if err != nil {
			return err
		}
		if err := dv.QueryRowContext(ctx).Scan(&version); err != nil {
			return err
		}
		st, err := conn.Stmt(ctx, c, `SELECT seq, id, topic, payload, typeof(payload) = 'text', type, content_type, created_at, attempts, expires_at
			FROM outbox WHERE seq > max(?, (SELECT sent_seq FROM outbox_state WHERE id = 1)) AND dead_at IS NULL
			ORDER BY seq LIMIT ?`)
		if err != nil {
			return err
		}
		rows, err := st.QueryContext(ctx, cursor, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		bytes := 0
		for rows.Next() {
			var m row
			var payload sql.RawBytes
			if err := rows.Scan(&m.seq, &m.id, &m.topic, &payload, &m.text, &m.typ, &m.contentType, &m.createdAt, &m.attempts, &m.expires); err != nil {
				return err
			}
			m.payload = payload
			r.enc.encodeRow(&m, carries)
			m.payload = nil // RawBytes is only valid until Next
			out = append(out, m)
			bytes += len(m.wire)
			if bytes >= maxBatchBytes {
				break
			}
		}
		return rows.Err()
	})
	return version, out, err
}

// waitForWork waits until a commit may have added rows: an in-process
// notification, a change of data_version (another connection or process
// committed), or the end of ctx (false).
func (r *Relay) waitForWork(ctx context.Context, conn *sqlconn.Conn, wake <-chan struct{}, version int64) bool {
	return r.watch.Wait(ctx, wake, func(ctx context.Context) (bool, bool) { return r.committed(ctx, conn, version) }, r.hearsAll.Load)
}

// committed reports whether another connection committed since version was
// read; ok is false when ctx ended.
func (r *Relay) committed(ctx context.Context, conn *sqlconn.Conn, version int64) (changed, ok bool) {
	var v int64
	if r.hooks.onAsk != nil {
		r.hooks.onAsk()
	}
	err := conn.Do(func(c *sql.Conn) error {
		dv, err := conn.Stmt(ctx, c, `PRAGMA data_version`)
		if err != nil {
			return err
		}
		return dv.QueryRowContext(ctx).Scan(&v)
	})
	if err != nil || v != version {
		return true, ctx.Err() == nil
	}
	return false, true
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
const markSQL = `UPDATE outbox_state SET
	pending_bytes = CASE WHEN max_pending_bytes = 0 OR ?1 >= coalesce((SELECT max(seq) FROM outbox), 0) THEN 0
		ELSE max(pending_bytes - (SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM outbox
			WHERE seq > outbox_state.sent_seq AND seq <= ?1 AND dead_at IS NULL), 0) END,
	skipped = CASE WHEN max_pending_count = 0 THEN 0
		WHEN ?1 >= coalesce((SELECT max(seq) FROM outbox), 0) THEN max(seq_floor - ?1, 0)
		ELSE max(skipped - (?1 - sent_seq)
			+ (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND seq <= ?1)
			- (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND seq <= ?1 AND dead_at IS NOT NULL), 0) END,
	sent_seq = ?1, sent_at = ?2
WHERE id = 1 AND sent_seq < ?1
	AND (?1 - sent_seq <= ?3
		OR (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND seq <= ?1)
			- (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND seq <= ?1 AND dead_at IS NOT NULL) <= ?3)`

// markSent records that every message up to and including the last of
// acked is settled; acked are the messages acknowledged since the last
// mark, in order. With a negative Retention the sent rows are then deleted.
func (r *Relay) markSent(conn *sqlconn.Conn, acked []int64) error {
	seq, n := acked[len(acked)-1], len(acked)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := conn.Do(func(c *sql.Conn) error {
		marked, err := conn.ExecPollingCount(ctx, c, markSQL, seq, r.ob.now().UnixMilli(), n)
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

// markPastIntruders is markSent's slow road, for a mark markSQL did not
// make: already made (nothing to do), or a range that holds rows the relay
// never read. Those are moved above every number used, as the insert moves
// a row it catches, and are published in their turn; then the mark is
// made, in the same transaction, so no writer comes in between.
func (r *Relay) markPastIntruders(ctx context.Context, conn *sqlconn.Conn, c *sql.Conn, acked []int64) error {
	seq, n := acked[len(acked)-1], len(acked)
	if err := conn.ExecPolling(ctx, c, `BEGIN IMMEDIATE`); err != nil {
		return err
	}
	err := func() error {
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
		_, err = c.ExecContext(ctx, markSQL, seq, r.ob.now().UnixMilli(), n)
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

// charge records one failed attempt against a pending message, with why;
// attempts is its count after. found is false for a message that is no
// longer pending (requeued, purged, parked): nothing is charged.
func (r *Relay) charge(conn *sqlconn.Conn, seq int64, cause error) (attempts int, id string, found bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = conn.Do(func(c *sql.Conn) error {
		return conn.QueryRowPolling(ctx, c, `UPDATE outbox SET attempts = attempts + 1, last_error = ?
			WHERE seq = ? AND dead_at IS NULL AND seq > (SELECT sent_seq FROM outbox_state WHERE id = 1)
			RETURNING attempts, id`,
			[]any{cause.Error(), seq}, &attempts, &id)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", false, nil
	}
	if err != nil {
		return 0, "", false, fmt.Errorf("outbox: count attempt: %w", classifyWriteErr(err))
	}
	r.metrics.charged.Add(1)
	return attempts, id, true, nil
}

// parking is a message to park, and how.
type parking struct {
	seq       int64
	id, topic string // for the log
	reason    string // what last_error says
	charge    bool   // count an attempt too: none was recorded for this failure
	expired   bool   // its expiry ran out: parked expired, not dead
}

// park parks a pending message: dead, or expired. It is the one write that
// sets dead_at, and it goes through the same write-error classification as
// the marks, so a full disk is recognised here too.
func (r *Relay) park(conn *sqlconn.Conn, p parking) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	charge := 0
	if p.charge {
		charge = 1
	}
	err := conn.Do(func(c *sql.Conn) error {
		return conn.ExecPolling(ctx, c, `UPDATE outbox SET attempts = attempts + ?, last_error = ?, dead_at = ?, expired = ?
			WHERE seq = ? AND dead_at IS NULL`, charge, p.reason, r.ob.now().UnixMilli(), p.expired, p.seq)
	})
	if err != nil {
		what := "dead"
		if p.expired {
			what = "expired"
		}
		return fmt.Errorf("outbox: mark %s: %w", what, classifyWriteErr(err))
	}
	if p.charge {
		r.metrics.charged.Add(1)
	}
	if p.expired {
		r.expired.Add(1)
		r.log.Warn("outbox message expired before its turn; parked, not published", "id", p.id, "seq", p.seq, "topic", p.topic, "why", p.reason)
		return nil
	}
	r.dead.Add(1)
	r.log.Warn("outbox message parked as dead", "id", p.id, "seq", p.seq, "topic", p.topic, "err", p.reason)
	return nil
}

// failed records a failed attempt of a message and asks the RetryPolicy
// what becomes of it: parked dead, or retried after retryAfter. A message
// that is no longer pending counts as settled (dead true).
func (r *Relay) failed(conn *sqlconn.Conn, seq int64, cause error) (retryAfter time.Duration, dead bool, err error) {
	attempts, id, found, err := r.charge(conn, seq, cause)
	if err != nil || !found {
		return 0, !found && err == nil, err
	}
	d := r.opts.Retry.Decide(Failure{Attempts: attempts, Err: cause})
	r.log.Warn("outbox message failed", "id", id, "seq", seq, "attempts", attempts, "dead", d.Dead, "err", cause)
	if !d.Dead {
		return d.RetryAfter, false, nil
	}
	if err := r.park(conn, parking{seq: seq, id: id, reason: cause.Error()}); err != nil {
		return 0, false, err
	}
	return 0, true, nil
}

// refusedForGood asks the RetryPolicy about a message refused for good (its
// token, or its encoding, says ErrUndeliverable) before anything was
// charged, and parks it at once if the policy says dead. parked is false
// when the policy wants it retried or the park failed: the message then
// goes through the charge of a rejected one (failed).
func (r *Relay) refusedForGood(conn *sqlconn.Conn, seq int64, id, topic string, attempts int, cause error) (parked bool, err error) {
	if !r.opts.Retry.Decide(Failure{Attempts: attempts + 1, Err: cause}).Dead {
		return false, nil
	}
	if err := r.park(conn, parking{seq: seq, id: id, topic: topic, reason: cause.Error(), charge: true}); err != nil {
		return false, err
	}
	return true, nil
}
