// Package wait holds the waits every loop of the relay and the subscriber
// shares: each must end with its context, and some also when woken.
package wait

import (
	"context"
	"time"
)

// Sleep waits d, or less when wake receives (a nil wake never does), and
// reports false if ctx ended first.
func Sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	_, ok := Tick(ctx, t.C, wake)
	return ok
}

// Tick waits until ctx ends (ok false), wake receives (woken true; a nil
// wake never does) or tick fires.
func Tick(ctx context.Context, tick <-chan time.Time, wake <-chan struct{}) (woken, ok bool) {
	select {
	case <-ctx.Done():
		return false, false
	case <-wake:
		return true, true
	case <-tick:
		return false, true
	}
}

// Every calls fn every d, and at once when wake receives, until ctx ends.
func Every(ctx context.Context, d time.Duration, wake <-chan struct{}, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		if _, ok := Tick(ctx, t.C, wake); !ok {
			return
		}
		fn()
	}
}

// Later returns the later of a and b.
func Later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
