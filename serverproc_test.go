package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// brokerCases runs the relay's core cases against a broker through p, a
// proxy in front of it, with sub subscribed to pos/# straight at the broker:
// 300 events in order; an outage in the middle with 100 more committed; a
// PUBACK withheld until the connection drops, after which the event is sent
// again and only then marked sent. It returns the duplicates sub saw.
func brokerCases(t *testing.T, ob *Outbox, r *Relay, p *harness.FaultProxy, sub *harness.Subscriber) (dups int) {
	t.Helper()
	for i := 0; i < 300; i++ {
		commitOrder(t, ob, "pos/orders", i)
	}
	eventually(t, 20*time.Second, "delivered", func() bool { return sub.Log.Unique() == 300 })

	// An outage: the relay cannot reach the broker while the till sells.
	p.Down()
	eventually(t, 5*time.Second, "relay notices", func() bool { s, _ := r.Stats(context.Background()); return !s.Connected })
	for i := 300; i < 400; i++ {
		commitOrder(t, ob, "pos/orders", i)
	}
	require.NoError(t, p.Up())
	eventually(t, 20*time.Second, "delivered after the outage", func() bool { return sub.Log.Unique() == 400 })

	// A PUBACK that never comes back, then the connection drops: resent,
	// never marked sent before.
	p.Drop(harness.ToClient)
	commitOrder(t, ob, "pos/orders", 400)
	eventually(t, 10*time.Second, "the broker has it", func() bool { return sub.Log.Unique() == 401 })
	state, _ := rowState(t, ob, 401)
	require.Equal(t, "pending", state, "not marked sent without its PUBACK")
	p.EndDrop()
	eventually(t, 10*time.Second, "acknowledged after the resend", func() bool { s, _ := rowState(t, ob, 401); return s == "sent" })

	got := sub.Log.Snapshot()
	require.Empty(t, got.Disorder, "first deliveries in commit order")
	require.Zero(t, got.DecodeErrors)
	require.Zero(t, countState(t, ob, "dead"))
	return got.Duplicates
}
