package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestClockJumpsChangeNothing: the device clock jumping hours back and
// forward changes neither delivery order nor the lease.
func TestClockJumpsChangeNothing(t *testing.T) { forProtocols(t, testClockJumpsChangeNothing) }

func testClockJumpsChangeNothing(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	clock := &harness.JumpyClock{}
	ob := openTest(t, Options{Now: clock.Now})
	opts := fastRelay()
	// Short, so that the check below spans several TTLs; not shorter: a
	// renewal late by a second on a loaded machine lost the lease at 1 s.
	const ttl = 2 * time.Second
	opts.LeaseTTL = ttl
	startRelay(t, mqttRelayOn(t, ob, b.url(), opts, proto))
	eventually(t, 5*time.Second, "lease held", func() bool { s, _ := ob.Stats(context.Background()); return s.LeaseOwner != "" })

	// A second relay on the same database, with the same jumpy clock,
	// waits for the lease. It must not take over because the clock jumped.
	other, err := ob.NewRelay(&fakePublisher{}, RelayOptions{LeaseTTL: ttl, Owner: "contender"})
	require.NoError(t, err)
	startRelay(t, other)

	jumps := []time.Duration{-5 * time.Hour, 9 * time.Hour, -365 * 24 * time.Hour, 365*24*time.Hour + 3*time.Hour, -30 * time.Minute}
	ctx := context.Background()
	for i := 0; i < 200; i++ {
		if i%40 == 0 {
			clock.Jump(jumps[i/40])
		}
		require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
			return ob.Enqueue(ctx, tx, Message{Topic: "pos/orders", Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
		}))
	}
	eventually(t, 10*time.Second, "all delivered", func() bool { return countState(t, ob, "sent") == 200 })
	require.Zero(t, checkOrdered(t, b.rec, 200), "delivered in commit order, once")
	// The event times follow the (wrong) clock; the order does not.
	all := b.rec.All()
	require.True(t, all[80].ev.Time.Before(all[79].ev.Time), "the clock went back a year between these two")

	// The holder keeps the lease through jumps for several TTLs.
	for i := 0; i < 3; i++ {
		clock.Jump(48 * time.Hour)
		deadline := time.Now().Add(ttl)
		for time.Now().Before(deadline) {
			s, err := ob.Stats(ctx)
			require.NoError(t, err)
			require.NotEqual(t, "contender", s.LeaseOwner, "lease taken over after a clock jump")
			time.Sleep(50 * time.Millisecond)
		}
	}
	sc, err := other.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, sc.SentSince)
}
