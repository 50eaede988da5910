package outboxtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// atLeastOnce: the connection is lost in the middle of a backlog, with a
// window of publishes whose acknowledgements were withheld; the broker is
// unreachable while more events are committed; and one acknowledgement is
// withheld until the connection drops. Every committed event arrives,
// first deliveries in commit order; no message is marked sent without its
// acknowledgement; none is dead and no attempt is charged (outages never
// count against a message); and the duplicates are only what was in flight
// when a connection was lost, a window at most per fault.
func atLeastOnce(t *testing.T, tr Transport) {
	x := newFixture(t, tr.Broker(t), tr.Features)
	b := x.broker
	topic := b.Topic
	backlog, outage := 150*scale(t), 50*scale(t)
	rr := x.start(relayOptions())
	x.connected(rr)
	w := effectiveWindow(rr.pub, window)
	committed, faults := 1, 0

	// Lost in the middle of a backlog.
	if b.Withhold != nil {
		b.Withhold()
		x.commit(topic, backlog)
		x.delivered(committed+w, "a window of the backlog, its acknowledgements withheld")
		require.Equal(t, committed, x.count(outbox.StateSent), "marked sent without an acknowledgement")
	} else {
		x.commit(topic, backlog)
		x.delivered(committed+backlog/4, "a quarter of the backlog")
	}
	mid := x.got.unique() < committed+backlog
	b.Cut()
	faults++
	committed += backlog
	x.delivered(committed, "the backlog, after the lost connection")
	if !mid {
		t.Logf("the backlog was delivered before the connection was cut (no Broker.Withhold to hold it)")
	}

	// An outage: the relay cannot reach the broker while events are
	// committed.
	if b.Down != nil {
		up := b.Down()
		faults++
		x.commit(topic, outage)
		committed += outage
		waitFor(t, patience, "the relay to find the broker unreachable", func() bool { return !rr.Metrics().Connected })
		up()
		x.delivered(committed, "the events committed during the outage")
	} else {
		t.Logf("no outage: the transport has no Broker.Down")
	}

	// An acknowledgement withheld until the connection drops: the event is
	// not marked sent before it, and is sent again after.
	if b.Withhold != nil {
		waitFor(t, patience, "every row sent", func() bool { return x.count(outbox.StateSent) == committed })
		b.Withhold()
		x.commit(topic, 1)
		committed++
		x.delivered(committed, "the event whose acknowledgement is withheld")
		rows := x.rows()
		require.Equal(t, outbox.StatePending, rows[len(rows)-1].state, "marked sent without its acknowledgement")
		b.Cut()
		faults++
	}

	waitFor(t, patience, "every row sent", func() bool { return x.count(outbox.StateSent) == committed })
	rows := x.rows()
	require.Len(t, rows, committed)
	dups := x.got.matches(t, rows, faults*w)
	x.noneCharged(rr)
	t.Logf("%d events delivered in commit order across %d faults, %d duplicates (at most %d), 0 dead, 0 attempts charged, %d connection attempts",
		committed, faults, dups, faults*w, rr.Metrics().ConnectionAttempts)
}
