package outbox

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Backoff is an exponential backoff with jitter that never gives up: each
// wait is Initial × Multiplier^n spread by ±Jitter (a fraction), so that a
// fleet of devices does not reconnect in lockstep, and never more than Max.
// The zero value uses the defaults given on each field.
type Backoff struct {
	Initial    time.Duration // first wait; default 500 ms
	Max        time.Duration // cap on one wait; default 30 s
	Multiplier float64       // default 2
	Jitter     float64       // 0..1; default 0.5. Negative means none.
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = 500 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 30 * time.Second
	}
	if b.Max < b.Initial {
		b.Max = b.Initial
	}
	if b.Multiplier < 1 {
		b.Multiplier = 2
	}
	switch {
	case b.Jitter < 0:
		b.Jitter = 0
	case b.Jitter == 0:
		b.Jitter = 0.5
	case b.Jitter > 1:
		b.Jitter = 1
	}
	return b
}

// newBackOff returns a fresh sequence of waits for this policy. The elapsed
// time limit is off: an outage of any length is waited out.
func (b Backoff) newBackOff() *backoff.ExponentialBackOff {
	b = b.withDefaults()
	eb := backoff.NewExponentialBackOff()
	eb.InitialInterval = b.Initial
	// backoff/v4 applies the jitter after the cap; shrink the cap so that
	// no wait exceeds Max while waits at the cap still spread out.
	eb.MaxInterval = time.Duration(float64(b.Max) / (1 + b.Jitter))
	if eb.MaxInterval < b.Initial {
		eb.MaxInterval = b.Initial
	}
	eb.Multiplier = b.Multiplier
	eb.RandomizationFactor = b.Jitter
	eb.MaxElapsedTime = 0
	eb.Reset()
	return eb
}

// sleep waits d, or less when wake receives (a nil wake never does), and
// reports false if ctx ended first: every wait between attempts must end
// with the relay or the subscriber, and the relay's reconnection wait also
// with ReconnectNow.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	_, ok := waitTick(ctx, t.C, wake)
	return ok
}

// waitTick waits until ctx ends (ok false), wake receives (woken true; a nil
// wake never does) or tick fires: the one wait of every loop that must end
// with the relay or the subscriber.
func waitTick(ctx context.Context, tick <-chan time.Time, wake <-chan struct{}) (woken, ok bool) {
	select {
	case <-ctx.Done():
		return false, false
	case <-wake:
		return true, true
	case <-tick:
		return false, true
	}
}

// every calls fn every d, and at once when wake receives, until ctx ends.
func every(ctx context.Context, d time.Duration, wake <-chan struct{}, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		if _, ok := waitTick(ctx, t.C, wake); !ok {
			return
		}
		fn()
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
