package wait

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestReconnect: failures are waited out with growing waits, a session
// that lasted past the longest wait starts them afresh, failed can stop
// it, and beside runs alongside and has ended when Reconnect returns.
func TestReconnect(t *testing.T) {
	// Max far above how long a failing session takes on a loaded machine,
	// and the fourth session far longer than Max.
	b := Backoff{Initial: time.Millisecond, Max: 200 * time.Millisecond, Jitter: -1}
	var waits []time.Duration
	sessions := 0
	var besideRan, besideRunning atomic.Bool
	boom := errors.New("boom")
	Reconnect(context.Background(), b, func(ctx context.Context) error {
		sessions++
		if sessions == 4 {
			// A working connection, lost after a while.
			time.Sleep(300 * time.Millisecond)
		}
		return boom
	}, func(ctx context.Context) {
		besideRan.Store(true)
		besideRunning.Store(true)
		<-ctx.Done()
		besideRunning.Store(false)
	}, func(err error, retryIn time.Duration) bool {
		require.ErrorIs(t, err, boom)
		waits = append(waits, retryIn)
		return len(waits) < 5
	})
	require.True(t, besideRan.Load())
	require.False(t, besideRunning.Load(), "beside has ended")
	require.Equal(t, 5, sessions)
	require.Equal(t, []time.Duration{1, 2, 4, 1, 2}, scale(waits, time.Millisecond), "the fourth session lasted past Max: afresh")
}

// TestReconnectEndsWithItsContext: a session that ends with ctx is not a
// failure, and no wait follows it.
func TestReconnectEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	Reconnect(ctx, Backoff{}, func(ctx context.Context) error {
		cancel()
		return ctx.Err()
	}, nil, func(error, time.Duration) bool {
		t.Fatal("failed was told of the shutdown")
		return true
	})
}

func scale(ds []time.Duration, unit time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / unit
	}
	return out
}
