package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// bucketOf returns the index of the first bound that holds d.
func bucketOf(d time.Duration) int {
	for i, b := range HistogramBounds() {
		if d.Seconds() <= b {
			return i
		}
	}
	return len(HistogramBounds())
}

// TestRelayMetrics checks the relay's own counters: connection attempts
// through an outage, the time without a connection, the histograms (one
// observation per acknowledged message, commit to PUBACK by the wall clock),
// the attempts charged and the lease.
func TestRelayMetrics(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{connErr: errors.New("broker down")}
	pub.reject = func(topic string) error {
		if strings.HasPrefix(topic, "bad/") {
			return fmt.Errorf("refused: %w", ErrRejected)
		}
		return nil
	}
	opts := fastRelay()
	opts.Retry = fastRetry(2)
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	require.Equal(t, RelayMetrics{LastWriteOK: true, Source: "/test/device"}, r.Metrics())
	startRelay(t, r)

	eventually(t, 5*time.Second, "three connection attempts", func() bool { return r.Metrics().ConnectionAttempts >= 3 })
	m := r.Metrics()
	require.True(t, m.Running)
	require.True(t, m.HoldsLease)
	require.False(t, m.Connected)
	require.Positive(t, m.Disconnected)
	require.False(t, m.Since.IsZero())
	require.Contains(t, m.LastError, "broker down")
	require.ErrorIs(t, m.LastErr, pub.connErr, "the error itself, for errors.Is")
	require.EqualError(t, m.LastErr, m.LastError)
	require.GreaterOrEqual(t, m.AttemptsSince, int64(3), "the first outage began at start")

	// Committed 90 s ago by the writer's clock.
	_, err = ob.DB().Exec(`INSERT INTO outbox (topic, payload, created_at) VALUES ('old/1', '{}', ?)`, time.Now().Add(-90*time.Second).UnixMilli())
	require.NoError(t, err)
	for i := range 5 {
		commitOrder(t, ob, "orders", i)
	}
	_, err = ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('bad/1', '{}')`)
	require.NoError(t, err)

	pub.mu.Lock()
	pub.connErr = nil
	pub.mu.Unlock()
	eventually(t, 5*time.Second, "six published, one dead", func() bool {
		m := r.Metrics()
		return m.Published == 6 && m.DeadLettered == 1
	})
	m = r.Metrics()
	require.True(t, m.Connected)
	require.True(t, m.LastWriteOK)
	require.Equal(t, int64(2), m.AttemptsCharged, "MaxAttempts 2: charged twice, then dead")
	require.Equal(t, uint64(6), m.PublishAck.Count)
	require.Equal(t, uint64(6), m.CommitAck.Count)
	require.Positive(t, m.PublishAck.Sum)
	old := bucketOf(90 * time.Second)
	require.Equal(t, uint64(5), m.CommitAck.Counts[old-1], "five committed just now, acknowledged within a minute")
	require.Equal(t, uint64(6), m.CommitAck.Counts[old], "the one committed 90 s ago in the bucket up to 300 s")
	require.GreaterOrEqual(t, m.CommitAck.Sum, 90.0)
	down := m.Disconnected
	require.GreaterOrEqual(t, m.ConnectionAttempts, int64(4))
	require.Zero(t, m.AttemptsSince, "connected: no outage")
	// Connected: the time without a connection stands still.
	require.Equal(t, down, r.Metrics().Disconnected)

	// A second outage: its attempts count from its start, not the
	// process's.
	before := m.ConnectionAttempts
	pub.mu.Lock()
	pub.connErr = errors.New("broker down again")
	pub.mu.Unlock()
	pub.Disconnect()
	commitOrder(t, ob, "orders", 9)
	eventually(t, 5*time.Second, "three attempts in the second outage", func() bool {
		m := r.Metrics()
		return !m.Connected && m.AttemptsSince >= 3
	})
	m = r.Metrics()
	require.LessOrEqual(t, m.AttemptsSince, m.ConnectionAttempts-before, "this outage's attempts only")
	require.Contains(t, m.LastError, "broker down again")
}

// TestGaugesMatchStats checks that Gauges, which scans nothing, says what
// Stats counts: with and without limits, with dead rows before and after
// the relay's mark. The one difference: a requeued message waits at the
// back of the line, and its earlier creation time is Stats' oldest, not
// Gauges', which is the first in line's.
func TestGaugesMatchStats(t *testing.T) {
	for _, limits := range []bool{false, true} {
		t.Run(fmt.Sprint("limits=", limits), func(t *testing.T) {
			opts := Options{}
			if limits {
				opts.MaxPendingMessages, opts.MaxPendingBytes = 1000, 1<<20
			}
			ob := openTest(t, opts)
			ctx := context.Background()
			check := func(what string, gaps bool) {
				t.Helper()
				s, err := ob.Stats(ctx)
				require.NoError(t, err)
				g, err := ob.Gauges(ctx)
				require.NoError(t, err)
				if gaps && !limits {
					// Numbers left behind above the mark: counted until
					// the relay passes them.
					require.GreaterOrEqual(t, g.Pending, s.Pending, what)
				} else {
					require.Equal(t, s.Pending, g.Pending, what)
				}
				require.Equal(t, s.Dead, g.Dead, what)
				if gaps {
					require.False(t, g.OldestPending.Before(s.OldestPending), "%s: oldest %v, gauges %v", what, s.OldestPending, g.OldestPending)
				} else {
					require.True(t, s.OldestPending.Equal(g.OldestPending), "%s: oldest %v, gauges %v", what, s.OldestPending, g.OldestPending)
				}
				require.Equal(t, limits, g.PendingBytesKnown, what)
				if limits {
					require.Equal(t, s.PendingBytes, g.PendingBytes, what)
				}
				require.Positive(t, g.DatabaseBytes, what)
				require.Positive(t, g.WALBytes, what)
			}
			check("empty", false)
			for i := range 10 {
				commitOrder(t, ob, "orders", i)
			}
			check("ten pending", false)
			pub := &fakePublisher{reject: func(topic string) error {
				if strings.HasPrefix(topic, "bad/") {
					return fmt.Errorf("%w: %w", ErrRejected, ErrUndeliverable)
				}
				return nil
			}}
			_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('bad/1', 'xx')`)
			require.NoError(t, err)
			r, err := ob.NewRelay(pub, fastRelay())
			require.NoError(t, err)
			stop := startRelay(t, r)
			eventually(t, 5*time.Second, "drained", func() bool {
				s, err := ob.Stats(ctx)
				return err == nil && s.Pending == 0 && s.Dead == 1
			})
			stop()
			check("drained, one dead", false)
			// A dead row above the mark: parked by hand, as the relay
			// does before its mark passes it.
			for i := range 3 {
				commitOrder(t, ob, "orders", 10+i)
			}
			_, err = ob.DB().Exec(`UPDATE outbox SET dead_at = 1, last_error = 'by hand' WHERE seq = (SELECT max(seq) - 1 FROM outbox)`)
			require.NoError(t, err)
			check("two pending, a dead one between", false)
			_, err = ob.RequeueDead(ctx)
			require.NoError(t, err)
			check("requeued", true)
			r, err = ob.NewRelay(pub, fastRelay())
			require.NoError(t, err)
			stop = startRelay(t, r)
			eventually(t, 5*time.Second, "drained again", func() bool {
				s, err := ob.Stats(ctx)
				return err == nil && s.Pending == 0
			})
			stop()
			check("drained again", false)
		})
	}
}

// BenchmarkGauges100k reads the figures a scrape needs at a backlog of
// 100,000 pending messages (BenchmarkStats100k counts them instead).
func BenchmarkGauges100k(b *testing.B) {
	ob := backlogOutbox(b, 100_000)
	ctx := context.Background()
	for b.Loop() {
		g, err := ob.Gauges(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if g.Pending != 100_000 {
			b.Fatalf("pending %d", g.Pending)
		}
	}
}
