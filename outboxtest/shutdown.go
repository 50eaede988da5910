package outboxtest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/edgeoutbox/outbox"
)

// shutdown: a relay cancelled with a window in flight returns within
// ShutdownTimeout (and a margin) — having awaited the acknowledgements
// that come in time and marked them sent, and leaving pending, uncharged,
// those that never come; a new relay then resumes and delivers everything,
// in commit order, nothing lost; and no goroutine outlives the relays.
func shutdown(t *testing.T, tr Transport) {
	b := tr.Broker(t)
	x := newFixture(t, b, tr.Features)
	topic := b.Topic
	opts := relayOptions()
	limit := opts.ShutdownTimeout + shutdownMargin
	// The Publishers first: a transport may start goroutines of its own
	// with one, which live as long as the case.
	pubs := []outbox.Publisher{b.Publisher(), b.Publisher(), b.Publisher()}
	leaks := goleak.IgnoreCurrent()

	// Acknowledgements that come after the cancellation, in time.
	first := x.startWith(pubs[0], opts)
	x.connected(first)
	w := effectiveWindow(first.pub, window)
	committed := 1 + 3*w
	if b.Pause != nil {
		resume := b.Pause()
		x.commit(topic, 3*w)
		waitFor(t, patience, "a window handed to the Publisher", func() bool { return first.Metrics().InFlight == int64(w) })
		first.halt()
		resume()
		took := first.stop(t)
		require.LessOrEqual(t, took, limit, "Run returned %s after its cancellation; ShutdownTimeout is %s", took, opts.ShutdownTimeout)
		require.GreaterOrEqual(t, x.count(outbox.StateSent), 1+w, "the acknowledgements in flight at the cancellation awaited and marked")
		t.Logf("cancelled with %d in flight, acknowledged after: awaited, Run returned in %s", w, took.Round(time.Millisecond))
	} else {
		x.commit(topic, 3*w)
		took := first.stop(t)
		require.LessOrEqual(t, took, limit, "Run returned %s after its cancellation; ShutdownTimeout is %s", took, opts.ShutdownTimeout)
	}
	require.Zero(t, x.count(outbox.StateDead))

	// Acknowledgements that never come.
	second := x.startWith(pubs[1], opts)
	waitFor(t, patience, "the rest of the backlog sent", func() bool {
		return x.count(outbox.StateSent) == committed && second.Metrics().InFlight == 0
	})
	if b.Withhold != nil {
		b.Withhold()
		x.commit(topic, 2*w)
		x.delivered(committed+w, "a window, its acknowledgements withheld")
		waitFor(t, patience, "the relay's window full", func() bool { return second.Metrics().InFlight == int64(w) })
		took := second.stop(t)
		require.LessOrEqual(t, took, limit, "Run returned %s after its cancellation with acknowledgements outstanding; ShutdownTimeout is %s",
			took, opts.ShutdownTimeout)
		for _, r := range x.rows()[committed:] {
			require.Equal(t, outbox.StatePending, r.state, "%v: left pending by a relay that never had its acknowledgement", r)
		}
		committed += 2 * w
		b.Cut()
		t.Logf("cancelled with %d acknowledgements that never came: Run returned in %s, the rows pending", w, took.Round(time.Millisecond))
	} else {
		took := second.stop(t)
		require.LessOrEqual(t, took, limit, "Run returned %s after its cancellation; ShutdownTimeout is %s", took, opts.ShutdownTimeout)
	}

	// A new relay resumes: nothing lost.
	third := x.startWith(pubs[2], opts)
	x.delivered(committed, "every event, after the restarts")
	waitFor(t, patience, "every row sent", func() bool { return x.count(outbox.StateSent) == committed })
	third.stop(t)
	rows := x.rows()
	require.Len(t, rows, committed)
	// What was in flight when a relay stopped may go again: a window for
	// each of the two.
	dups := x.got.matches(t, rows, 2*w)
	x.noneCharged(first, second, third)
	goleak.VerifyNone(t, leaks)
	t.Logf("%d events delivered in order across two shutdowns, %d duplicates, no goroutine left", committed, dups)
}
