package outboxtest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// windowHold is how long the window case watches a full window for a
// publish beyond it: a relay that overruns its window does so within a
// round trip of a slot's filling.
const windowHold = 200 * time.Millisecond

// theWindow: never more than RelayOptions.Window publishes await their
// acknowledgement at once, and never more than a broker's smaller limit
// where the transport has one (WindowLimiter). With the acknowledgements
// withheld, the broker receives exactly a window of a backlog, and no
// more while it watches; where the broker counts what awaits its
// acknowledgement (PeakInFlight), its count is within the window.
func theWindow(t *testing.T, tr Transport) {
	t.Run("RelayOptions.Window", func(t *testing.T) { windowKept(t, tr.Broker(t), tr.Features, 0) })
	t.Run("a broker's smaller limit", func(t *testing.T) {
		if tr.Limited == nil {
			t.Skip("the transport has no broker limit (Transport.Limited)")
		}
		const limit = 5
		windowKept(t, tr.Limited(t, limit), tr.Features, limit)
	})
}

// windowKept checks the window on b; limit is the broker's, 0 for none.
func windowKept(t *testing.T, b Broker, f Features, limit int) {
	if b.Withhold == nil && b.PeakInFlight == nil {
		t.Skip("the window cannot be seen: the Broker has neither Withhold nor PeakInFlight")
	}
	x := newFixture(t, b, f)
	rr := x.start(relayOptions())
	x.connected(rr)
	w := effectiveWindow(rr.pub, window)
	if limit > 0 {
		wl, ok := rr.pub.(outbox.WindowLimiter)
		require.True(t, ok, "a Publisher to a broker with a limit tells it (outbox.WindowLimiter)")
		require.Equal(t, limit, wl.MaxInFlight(), "the broker's limit, as the Publisher tells it")
		require.Equal(t, limit, w)
	} else if w < window {
		t.Logf("the broker's own limit, %d, is below the relay's window, %d", w, window)
	}

	n := 3 * w
	committed := 1 + n
	if b.Withhold != nil {
		b.Withhold()
		x.commit(b.Topic, n)
		x.delivered(1+w, "a window of publishes, their acknowledgements withheld")
		waitFor(t, patience, "the relay's window full", func() bool { return rr.Metrics().InFlight == int64(w) })
		var delivered int
		var inFlight int64
		kept := holds(windowHold, func() bool {
			delivered, inFlight = x.got.unique(), rr.Metrics().InFlight
			return delivered == 1+w && inFlight <= int64(w)
		})
		require.True(t, kept, "more than a window of %d awaiting acknowledgement: %d events delivered past the first, %d in flight",
			w, delivered-1, inFlight)
		require.Equal(t, 1, x.count(outbox.StateSent), "marked sent without an acknowledgement")
		b.Cut()
	} else {
		x.commit(b.Topic, n)
	}
	x.delivered(committed, "the backlog")
	waitFor(t, patience, "every row sent", func() bool { return x.count(outbox.StateSent) == committed })
	if b.PeakInFlight != nil {
		peak := b.PeakInFlight()
		require.LessOrEqual(t, peak, w, "publishes awaiting acknowledgement at once, as the broker counted them")
		if b.Withhold != nil {
			require.Equal(t, w, peak, "a withheld window, as the broker counted it")
		}
	}
	dups := x.got.matches(t, x.rows(), w)
	x.noneCharged(rr)
	t.Logf("a window of %d held (relay's %d, broker's limit %d): %d events delivered in order, %d duplicates", w, window, limit, committed, dups)
}
