package outboxtest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// refusals: a message the broker refuses for itself, between messages it
// accepts. Refused (RefusedForGood, RefusedForNow, RefusedByClosing), it is
// parked dead — after one attempt when the refusal is permanent, else after
// the RetryPolicy's MaxAttempts — with its reason in last_error (List of
// StateDead), and the messages behind it flow on, in commit order; a
// refusal on a connection kept costs no reconnection. Acknowledged and
// dropped (AckedAndDropped), it is marked sent, none dead, and a later
// message arrives while it never does.
func refusals(t *testing.T, tr Transport) {
	if tr.Refusing == nil {
		t.Skip("no broker set up to refuse a publish (Transport.Refusing)")
	}
	b := tr.Refusing(t)
	require.NotEmpty(t, b.Refused, "Broker.Refused")
	mode := tr.Features.Refusal
	x := newFixture(t, b, tr.Features)
	rr := x.start(relayOptions())
	x.connected(rr)
	w := effectiveWindow(rr.pub, window)
	connections := rr.Metrics().ConnectionAttempts

	const around = 10
	x.commit(b.Topic, around)
	x.commit(b.Refused, 1)
	x.commit(b.Topic, around)
	committed := 2 + 2*around
	refused := x.rows()[1+around]

	if mode == AckedAndDropped {
		waitFor(t, patience, "every row sent, the refused one too", func() bool { return x.count(outbox.StateSent) == committed })
		// A fence: the broker routes one connection's messages in order,
		// so once a later one has arrived the refused one is not on its way.
		x.commit(b.Topic, 1)
		committed++
		x.delivered(committed-1, "the accepted events and the fence")
		require.False(t, x.got.has(refused.id), "the refused message was delivered")
		require.Zero(t, x.count(outbox.StateDead))
	} else {
		waitFor(t, patience, "the refused message dead, the others sent", func() bool {
			return x.count(outbox.StateDead) == 1 && x.count(outbox.StateSent) == committed-1
		})
		// A broker may acknowledge before its subscribers have a message.
		x.delivered(committed-1, "the accepted events")
	}

	rows := x.rows()
	got := rows[1+around]
	require.Equal(t, refused.id, got.id)
	maxDups := 0
	switch mode {
	case RefusedForGood:
		require.Equal(t, outbox.StateDead, got.state)
		require.Equal(t, 1, got.attempts, "dead at the first, permanent, refusal")
	case RefusedForNow, RefusedByClosing:
		require.Equal(t, outbox.StateDead, got.state)
		require.Equal(t, maxAttempts, got.attempts, "dead after the RetryPolicy's MaxAttempts")
		// The messages behind it that were acknowledged while it failed
		// go again after it.
		maxDups = maxAttempts * w
	case AckedAndDropped:
		require.Equal(t, outbox.StateSent, got.state, "an acknowledged message is sent, as far as the relay can tell")
	}
	if mode != AckedAndDropped {
		dead, err := x.ob.List(context.Background(), outbox.ListOptions{State: outbox.StateDead})
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Equal(t, refused.id, dead[0].ID)
		if tr.Features.RefusalReason != "" && mode != RefusedByClosing {
			require.Equal(t, tr.Features.RefusalReason, dead[0].LastError, "the refusal's reason")
		} else {
			require.NotEmpty(t, dead[0].LastError, "why it is dead")
		}
	}
	if mode != RefusedByClosing {
		require.Equal(t, connections, rr.Metrics().ConnectionAttempts, "a refusal cost a reconnection")
		require.True(t, rr.Metrics().Connected, "the connection was kept")
	}
	dups := x.got.matches(t, only(rows, func(r row) bool { return r.id != refused.id }), maxDups)
	if b.AfterRefusal != nil {
		b.AfterRefusal(t)
	}
	if mode == AckedAndDropped {
		t.Logf("%s: a refused message marked sent and never delivered, the %d others delivered in order, the connection kept", mode, len(rows)-1)
		return
	}
	t.Logf("%s: a refused message dead after %d attempts (%q), the %d others delivered in order, %d duplicates",
		mode, got.attempts, got.lastError, len(rows)-1, dups)
}
