package outbox

import (
	"context"
	"fmt"
	"time"
)

// How expiry is measured: on the outbox clock (internal/clock), never on
// the wall clock, stored in outbox_state.clock_ms. Clamping what the wall
// clock may have jumped by would need a process that saw the jump, which a
// restart after an NTP sync does not have. A message lives its Expiry of
// time in which an outbox ran — an outage of the broker counts, the device
// being off does not: a till switched off overnight does not expire its
// backlog (documented).
// The clock stands still while a connected relay waits with nothing in
// flight (session.idle): no message's life runs then, and the idle relay
// need store nothing. A writer in another process stamps with the stored
// value, which may lag the relay's by about outboxClockStoreEvery: its
// messages may live that much less.

// outboxClockStoreEvery is how far an Outbox's clock may run ahead of the
// stored one before the relay (at a lease renewal) or an Enqueue with an
// expiry stores it: other processes, and this one after a restart, start
// from the stored clock. Not at every write: each store adds a page to the
// WAL.
const outboxClockStoreEvery = 10 * time.Second

// readOutboxClock reads the stored clock; 0 on a schema without one.
func readOutboxClock(ctx context.Context, db querier) (int64, error) {
	var ms int64
	err := db.QueryRowContext(ctx, `SELECT clock_ms FROM outbox_state WHERE id = 1`).Scan(&ms)
	return ms, err
}

// storeClock stores the outbox clock (only ever forward) and catches up
// with what is stored.
func (o *Outbox) storeClock(ctx context.Context, db querier) error {
	var stored int64
	err := db.QueryRowContext(ctx, `UPDATE outbox_state SET clock_ms = max(clock_ms, ?) WHERE id = 1 RETURNING clock_ms`, o.clock.Now()).Scan(&stored)
	if err != nil {
		return fmt.Errorf("outbox: storing the outbox clock: %w", classifyWriteErr(err))
	}
	o.clock.CatchUp(stored)
	return nil
}

// expiryMillis is d in whole milliseconds, rounded up, so that a message
// never lives less than its Expiry.
func expiryMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// expiryLeft is what is left of m's expiry now; ok is false for a message
// without one.
func (r *Relay) expiryLeft(m *row) (left time.Duration, ok bool) {
	if !m.expires.Valid {
		return 0, false
	}
	return time.Duration(m.expires.Int64-r.ob.clock.Now()) * time.Millisecond, true
}

// atItsTurn looks at m's expiry just before it is handed off — at its
// turn, not when its batch was read, since the window may have kept it
// waiting. With time left, it gives what is left to an MQTT 5 connection
// (the Message Expiry Interval) and says publish. With none, it parks m
// instead and gives back the slot and the admission m had taken; ok false
// means that failed and the session must end (m stays pending, and nothing
// after it may be marked).
func (s *session) atItsTurn(m *row, p *parcel) (publish, ok bool) {
	left, expires := s.r.expiryLeft(m)
	if !expires {
		return true, true
	}
	if left > 0 {
		p.props.MessageExpiry = left
		return true, true
	}
	err := s.r.park(s.conn, parking{seq: m.seq, id: m.id, topic: m.topic, expired: true,
		reason: fmt.Sprintf("expired (not published): its expiry ran out %s before its turn", -left)})
	<-s.slots
	if err != nil {
		s.r.writeFailed(err)
		s.setFail(failure{seq: m.seq, err: err, fault: faultNotSent})
		return false, false
	}
	s.gate.Settle(1)
	return false, true
}
