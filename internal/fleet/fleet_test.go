package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/edgeoutbox/outbox"
)

func TestFleetRecoversWithoutLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const devices = 30
	run := func(jitter float64) Report {
		rep, err := Run(context.Background(), Config{
			Devices:   devices,
			Rate:      5,
			Steady:    time.Second,
			Outage:    3 * time.Second,
			Reconnect: outbox.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: jitter},
			Dir:       t.TempDir(),
			Progress:  t.Logf,
		})
		require.NoError(t, err)
		t.Logf("%+v", rep)
		require.False(t, rep.DeliveryTimeout)
		require.Positive(t, rep.PeakBacklog, "devices kept committing through the outage")
		require.Zero(t, rep.Lost)
		require.Zero(t, rep.Phantom)
		require.Zero(t, rep.CommitErrors)
		require.Equal(t, rep.Committed, rep.Delivered)
		require.GreaterOrEqual(t, rep.RecoveryAttempts, devices, "every device reconnected")
		require.Positive(t, rep.OutageAttempts, "devices kept trying while the broker was away")
		require.Positive(t, rep.HeapPerDevice)
		return rep
	}
	lockstep := run(-1)
	spread := run(1)
	// Without jitter the fleet knocks within the same moment (the 1 s
	// window allows for a loaded machine; under CI's parallel packages 25
	// of 30 once fell in one second, the rest 1.25 s after the broker's
	// return); with it, the attempts spread over the wait, and no 100 ms
	// holds most of the fleet.
	require.GreaterOrEqual(t, lockstep.PeakPerSecond, devices*3/4)
	require.LessOrEqual(t, spread.Peak100msPerSec/10, float64(devices)*0.6)
}

func TestPeakInWindow(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	require.Equal(t, 0, peakInWindow(nil, time.Second))
	require.Equal(t, 3, peakInWindow(at(0, 950, 990, 1000, 2000), time.Second))
	require.Equal(t, 2, peakInWindow(at(0, 99, 100, 199), 100*time.Millisecond))
	require.Equal(t, 4, peakInWindow(at(500, 0, 400, 300), time.Second), "unsorted input")
	// p99 over ten 100 ms buckets: the largest.
	require.Equal(t, 3.0, p99Buckets(at(0, 10, 20, 500), t0, t0.Add(time.Second-time.Millisecond), 100*time.Millisecond))
}
