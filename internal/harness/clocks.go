package harness

import (
	"sync"
	"sync/atomic"
	"time"
)

// NewFixedClock is a FixedClock that shows t.
func NewFixedClock(t time.Time) *FixedClock { return &FixedClock{t: t} }

// FixedClock is a wall clock that shows what the test sets: Now is its
// method value to hand to an Options.Now.
type FixedClock struct {
	mu sync.Mutex
	t  time.Time
}

// Now is the time last set.
func (c *FixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set sets the time.
func (c *FixedClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// FakeElapsed stands in for a stored clock's monotonic time (the outbox
// clock, the inbox clock): it moves only when the test says so.
type FakeElapsed struct{ d atomic.Int64 }

// Elapsed is the time advanced so far.
func (f *FakeElapsed) Elapsed() time.Duration { return time.Duration(f.d.Load()) }

// Advance moves it on by d.
func (f *FakeElapsed) Advance(d time.Duration) { f.d.Add(int64(d)) }

// JumpyClock is a device's wall clock that the test moves by hours at
// will, as an RTC reset or an NTP sync does.
type JumpyClock struct {
	mu     sync.Mutex
	offset time.Duration
}

// Now is the real time moved by every jump so far.
func (c *JumpyClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

// Jump moves the clock by d.
func (c *JumpyClock) Jump(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}
