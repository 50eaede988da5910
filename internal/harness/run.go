package harness

import (
	"context"
	"sync"
	"time"
)

// Runner is what runs until its context ends, as a relay does.
type Runner interface {
	Run(ctx context.Context) error
}

// RunInBackground runs r until stop is called or tb ends, whichever comes
// first, and fails tb if Run returns an error or does not return within
// 15 s of being stopped. what names r in those failures.
func RunInBackground(tb TB, what string, r Runner) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("%s.Run: %v", what, err)
				}
			case <-time.After(15 * time.Second):
				tb.Errorf("%s did not stop", what)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
