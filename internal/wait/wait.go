// Package wait holds the waits every loop of the relay and the subscriber
// shares: each must end with its context, and some also when woken.
package wait

import (
	"context"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
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

// Backoff is an exponential backoff with jitter that never gives up, the
// fields of the library's public Backoff (which converts to it): each wait
// is Initial × Multiplier^n spread by ±Jitter, never more than Max.
type Backoff struct {
	Initial    time.Duration
	Max        time.Duration
	Multiplier float64
	Jitter     float64
}

// WithDefaults fills in what is not set: 500 ms initial, 30 s cap,
// multiplier 2, jitter 0.5 (negative: none).
func (b Backoff) WithDefaults() Backoff {
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

// Sequence returns a fresh sequence of waits. The elapsed time limit is
// off: an outage of any length is waited out.
func (b Backoff) Sequence() *backoff.ExponentialBackOff {
	b = b.WithDefaults()
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

// Reconnect runs session until ctx ends, and again after each failure, the
// backoff b apart: a session that lasted longer than b's longest wait was
// a working connection, and the next failure starts the sequence afresh.
// beside, if not nil, runs alongside for as long (a purge, an expiry), and
// has ended when Reconnect returns. failed hears each failure with the wait
// before the next session; it returns false to stop.
func Reconnect(ctx context.Context, b Backoff, session func(context.Context) error, beside func(context.Context), failed func(err error, retryIn time.Duration) bool) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the Wait: beside ends with ctx
	if beside != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			beside(ctx)
		}()
	}
	seq, longest := b.Sequence(), b.WithDefaults().Max
	for ctx.Err() == nil {
		start := time.Now()
		err := session(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > longest {
			seq.Reset()
		}
		delay := seq.NextBackOff()
		if !failed(err, delay) || !Sleep(ctx, delay, nil) {
			return
		}
	}
}
