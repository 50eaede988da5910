package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffNeverExceedsMax(t *testing.T) {
	b := Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}.newBackOff()
	var atCap []time.Duration
	for i := 0; i < 200; i++ {
		d := b.NextBackOff()
		require.LessOrEqual(t, d, 100*time.Millisecond)
		require.Positive(t, d, "never gives up")
		if i > 20 {
			atCap = append(atCap, d)
		}
	}
	lo, hi := atCap[0], atCap[0]
	for _, d := range atCap {
		lo, hi = min(lo, d), max(hi, d)
	}
	require.Greater(t, hi-lo, 20*time.Millisecond, "waits at the cap are still spread by jitter")
	require.Equal(t, 30*time.Second, retryDelay(Backoff{Initial: time.Second, Max: 30 * time.Second}, 10))
	require.Equal(t, 2*time.Second, retryDelay(Backoff{Initial: time.Second, Max: 30 * time.Second}, 2))
}
