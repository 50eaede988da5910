package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/edgeoutbox/outbox/internal/lease"
	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// What becomes of a message that failed by itself: the attempt recorded,
// the RetryPolicy asked (backoff.go), and the one write that parks a row.

// charge records one failed attempt against a pending message, with why;
// attempts is its count after. found is false for a message that is no
// longer pending (requeued, purged, parked): nothing is charged. Like every
// state write it checks the lease in the same statement, and a write the
// lease's loss stopped returns ErrLeaseLost (leaseGone).
func (r *Relay) charge(conn *sqlconn.Conn, seq int64, cause error) (attempts int, id string, found bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = conn.Do(func(c *sql.Conn) error {
		err := conn.QueryRowPolling(ctx, c, chargeSQL,
			append([]any{cause.Error(), seq}, r.lease.HeldArgs()...), &attempts, &id)
		if errors.Is(err, sql.ErrNoRows) {
			if err := r.leaseGone(ctx, c); err != nil {
				return err
			}
		}
		return err
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

// chargeSQL counts an attempt against a pending row: not dead, above the
// common mark and above its priority's.
var chargeSQL = `UPDATE outbox SET attempts = attempts + 1, last_error = ?
	WHERE seq = ? AND dead_at IS NULL
		AND seq > (SELECT max(st.sent_seq, ` + markOfSQL("outbox.priority", "st") + `) FROM outbox_state st WHERE st.id = 1)
		AND ` + lease.HeldSQL + `
	RETURNING attempts, id`

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
// the marks, so a full disk is recognised here too; like them, it checks
// the lease in the same statement (ErrLeaseLost when it is gone).
func (r *Relay) park(conn *sqlconn.Conn, p parking) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	charge := 0
	if p.charge {
		charge = 1
	}
	err := conn.Do(func(c *sql.Conn) error {
		n, err := conn.ExecPollingCount(ctx, c, `UPDATE outbox SET attempts = attempts + ?, last_error = ?, dead_at = ?, expired = ?
			WHERE seq = ? AND dead_at IS NULL AND `+lease.HeldSQL,
			append([]any{charge, p.reason, r.ob.now().UnixMilli(), p.expired, p.seq}, r.lease.HeldArgs()...)...)
		if err == nil && n == 0 {
			err = r.leaseGone(ctx, c)
		}
		return err
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
