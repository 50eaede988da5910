package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// How expiry is measured: on the outbox clock, never on the wall clock.
//
// A till without a real-time clock boots at 1970 and commits its backlog
// there; NTP then sets the clock 56 years forward. Measured by the wall
// clock, every message with an expiry would be past it at once, and the
// whole backlog would be parked unsent. Clamping what the wall clock may
// have jumped by needs a process that saw the jump, which a restart after
// the sync does not have. So a message's expiry is a point on the outbox
// clock: milliseconds of monotonic time during which an outbox ran on this
// database, stored in outbox_state.clock_ms. Each Outbox starts from the
// stored value, adds the monotonic time since (which NTP and RTC resets do
// not move), catches up with a later value another process stored, and
// stores its own now and then. A message lives its Expiry of time in which
// an outbox ran — an outage of the broker counts, the device being off does
// not: a till switched off overnight does not expire its backlog (documented).
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

// outboxClock is an Outbox's view of the outbox clock.
type outboxClock struct {
	elapsed func() time.Duration // monotonic time since Open

	mu     sync.Mutex
	base   int64 // the clock in ms when elapsed() was 0; only grows
	stored int64 // the latest stored clock this Outbox wrote or read
	// The relay pauses the clock while it waits with nothing in flight
	// (session.idle): skipped is the elapsed time spent paused, pausedAt
	// the elapsed time at the pause under way.
	paused   bool
	pausedAt time.Duration
	skipped  time.Duration
}

func newOutboxClock(stored int64, elapsed func() time.Duration) *outboxClock {
	if elapsed == nil {
		start := time.Now()
		elapsed = func() time.Duration { return time.Since(start) }
	}
	return &outboxClock{elapsed: elapsed, base: stored, stored: stored}
}

// now is the clock in ms; c.mu is held.
func (c *outboxClock) now() int64 {
	e := c.elapsed()
	if c.paused {
		e = c.pausedAt
	}
	return c.base + (e - c.skipped).Milliseconds()
}

// tick is the outbox clock in ms.
func (c *outboxClock) tick() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now()
}

// pause stops the clock until resume.
func (c *outboxClock) pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.paused {
		c.paused, c.pausedAt = true, c.elapsed()
	}
}

// resume starts the clock again where it stopped, and says for how long it
// stood still.
func (c *outboxClock) resume() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.paused {
		return 0
	}
	d := c.elapsed() - c.pausedAt
	c.paused, c.skipped = false, c.skipped+d
	return d
}

// due reports the tick, and whether it is far enough ahead of the stored
// clock to store.
func (c *outboxClock) due() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.now()
	return t, t-c.stored >= outboxClockStoreEvery.Milliseconds()
}

// ahead is how far, in ms, the clock is ahead of the stored one.
func (c *outboxClock) ahead() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now() - c.stored
}

// catchUp notes the stored clock and moves this clock forward to it when
// another process stored a later tick; it never moves it back.
func (c *outboxClock) catchUp(stored int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stored = max(c.stored, stored)
	if t := c.now(); stored > t {
		c.base += stored - t
	}
}

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
	err := db.QueryRowContext(ctx, `UPDATE outbox_state SET clock_ms = max(clock_ms, ?) WHERE id = 1 RETURNING clock_ms`, o.clock.tick()).Scan(&stored)
	if err != nil {
		return fmt.Errorf("outbox: storing the outbox clock: %w", classifyWriteErr(err))
	}
	o.clock.catchUp(stored)
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
	return time.Duration(m.expires.Int64-r.ob.clock.tick()) * time.Millisecond, true
}

// atItsTurn looks at m's expiry just before it is handed off — at its
// turn, not when its batch was read, since the window may have kept it
// waiting. With time left, it gives what is left to an MQTT 5 connection
// (the Message Expiry Interval) and says publish. With none, it parks m
// instead and gives back the slot and the admission m had taken; ok false
// means that failed and the session must end (m stays pending, and nothing
// after it may be marked).
func (s *session) atItsTurn(m *row) (publish, ok bool) {
	left, expires := s.r.expiryLeft(m)
	if !expires {
		return true, true
	}
	if left > 0 {
		m.props.MessageExpiry = left
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
	s.gate.settle(1)
	return false, true
}
