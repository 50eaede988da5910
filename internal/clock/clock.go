// Package clock is a clock that wall-clock jumps cannot move: milliseconds
// of monotonic time during which a process ran on a database, stored in that
// database so that it survives restarts and is shared with other processes.
// The outbox measures message expiry on one (outbox_state.clock_ms), the
// inbox its dedupe window on another (inbox_clock.elapsed_ms).
//
// A device without a real-time clock boots at 1970 and NTP later moves its
// wall clock decades forward; measured by that clock, everything would
// expire at once. So each process starts from the stored value, adds the
// monotonic time since (which NTP and RTC resets do not move), catches up
// with a later value another process stored, and stores its own now and
// then. Time the device was off does not count.
package clock

import (
	"sync"
	"time"
)

// Stored is one process's view of a stored clock. Reading and writing the
// stored value is its user's: Due says when.
type Stored struct {
	elapsed    func() time.Duration // monotonic time since New
	storeEvery time.Duration

	mu     sync.Mutex
	base   int64 // the clock in ms when elapsed() was 0; only grows
	stored int64 // the latest stored value this process wrote or read
	// While paused, the clock stands still: skipped is the elapsed time
	// spent paused, pausedAt the elapsed time at the pause under way.
	paused   bool
	pausedAt time.Duration
	skipped  time.Duration
}

// New starts a clock at stored, the value read from the database. elapsed,
// if not nil, replaces the monotonic time since New (tests). Due reports a
// store once the clock runs storeEvery ahead of the stored value: not at
// every write, since each store adds a page to the database's WAL.
func New(stored int64, elapsed func() time.Duration, storeEvery time.Duration) *Stored {
	if elapsed == nil {
		start := time.Now()
		elapsed = func() time.Duration { return time.Since(start) }
	}
	return &Stored{elapsed: elapsed, storeEvery: storeEvery, base: stored, stored: stored}
}

// now is the clock in ms; c.mu is held.
func (c *Stored) now() int64 {
	e := c.elapsed()
	if c.paused {
		e = c.pausedAt
	}
	return c.base + (e - c.skipped).Milliseconds()
}

// Now is the clock in ms.
func (c *Stored) Now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now()
}

// Due reports the clock, and whether it runs far enough ahead of the
// stored value to store it.
func (c *Stored) Due() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.now()
	return t, t-c.stored >= c.storeEvery.Milliseconds()
}

// Ahead is how far, in ms, the clock runs ahead of the stored value.
func (c *Stored) Ahead() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now() - c.stored
}

// CatchUp notes a value read from (or written to) the database and moves
// the clock forward to it when another process stored a later one; it never
// moves it back.
func (c *Stored) CatchUp(stored int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stored = max(c.stored, stored)
	if t := c.now(); stored > t {
		c.base += stored - t
	}
}

// Pause stops the clock until Resume.
func (c *Stored) Pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.paused {
		c.paused, c.pausedAt = true, c.elapsed()
	}
}

// Resume starts the clock again where it stopped, and says for how long it
// stood still.
func (c *Stored) Resume() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.paused {
		return 0
	}
	d := c.elapsed() - c.pausedAt
	c.paused, c.skipped = false, c.skipped+d
	return d
}
