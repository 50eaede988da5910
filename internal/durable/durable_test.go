package durable

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// rows is a batch whose row i has seq seqs[i] and id "id-" + seq.
type rows []int64

func (r rows) Len() int                         { return len(r) }
func (r rows) Row(i int) (seq int64, id string) { return r[i], fmt.Sprint("id-", r[i]) }

// TestGateSyncsLate: the gate asks for a sync as late as it can without
// making dispatch wait, so that each sync covers most of what the bound
// allows (asking at half the bound covered half as much). The publishing
// is simulated in steps of one hand-off: a window of 16 in flight, each
// acknowledgement marked at once, and a sync that takes as long as 4
// hand-offs.
func TestGateSyncsLate(t *testing.T) {
	const window, messages, syncTakes = 16, 20000, 4
	var count atomic.Int64
	var g *Gate
	ctx := context.Background()
	handed, settled, waits := 0, 0, 0
	step := func() {
		if handed < messages {
			if g.ahead()+1 > g.bound {
				waits++ // dispatch would wait for the sync
				g.askIfAhead()
			} else {
				require.True(t, g.Admit(ctx))
				handed++
			}
		}
		if handed-settled > window || (handed == messages && settled < messages) {
			g.Settle(1)
			settled++
		}
	}
	g = NewGate(func() error {
		for range syncTakes {
			step()
		}
		return nil
	}, &count, window+256)
	for settled < messages {
		step()
		select {
		case <-g.kick: // syncLoop, in step
			if g.due() {
				count.Add(1)
				require.NoError(t, g.SyncNow())
			}
		default:
		}
		require.LessOrEqual(t, g.ahead(), g.bound)
	}
	perSync := float64(messages) / float64(count.Load())
	t.Logf("%d syncs for %d messages: %.0f per sync (bound %d); dispatch waited %d times",
		count.Load(), messages, perSync, g.bound, waits)
	require.Zero(t, waits, "a sync asked for too late makes dispatch wait")
	// Asked at half the bound, a sync covered about bound/2 − window + 4
	// (124), half that when asked again at once for an ask made during it;
	// now about bound − 2×4 − 8 − window + 4 (244).
	require.Greater(t, perSync, float64(g.bound)*3/4, "a sync asked for too early covers too little")
}

// TestCommitsRanges: what Commits counts as durable — the
// rows of committed ranges and of an open transaction whose last row the
// batch holds — and nothing else.
func TestCommitsRanges(t *testing.T) {
	d := &Commits{Full: true}
	batch := func(seqs ...int64) Batch { return rows(seqs) }
	a, b, c := new(sql.Tx), new(sql.Tx), new(sql.Tx)
	d.Begin(a)
	d.Enqueued(a, 1, 3, "id-3")
	require.False(t, d.Covers(batch(1, 2)), "an open transaction's rows without its last")
	require.True(t, d.Covers(batch(1, 2, 3)), "an open transaction's rows with its last: visible, so committed")
	require.False(t, d.Covers(batch(1, 2, 3, 4)), "a row of no transaction's")
	d.End(a, true)
	d.Begin(b)
	d.Enqueued(b, 4, 5, "id-5")
	d.End(b, true)
	require.True(t, d.Covers(batch(2, 3, 4, 5)), "two committed ranges, merged")
	d.Begin(c)
	d.Enqueued(c, 6, 6, "id-6")
	d.End(c, false)
	require.False(t, d.Covers(batch(5, 6)), "a rolled-back transaction's seq is another writer's")
	require.False(t, d.Covers(batch(7)))
	require.False(t, d.Covers(batch(1)), "ranges that end before a batch are forgotten")
	require.False(t, (&Commits{}).Covers(batch(1)), "at NORMAL nothing is known")
}

// TestGateTickets: a read's rows are covered only by a sync that began
// after the read's ticket and succeeded — not by one already running when
// the ticket was taken, nor by one that failed — and Ended tells of each
// end; Running tells whether one begun after the ticket is under way.
func TestGateTickets(t *testing.T) {
	var count atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	var fail atomic.Bool
	g := NewGate(func() error {
		entered <- struct{}{}
		<-release
		if fail.Load() {
			return fmt.Errorf("input/output error")
		}
		return nil
	}, &count, 100)
	begin := func() chan error {
		done := make(chan error, 1)
		go func() { done <- g.SyncNow() }()
		<-entered
		return done
	}

	// A sync under way when the ticket is taken does not cover it.
	done := begin()
	ticket := g.Ticket()
	ended := g.Ended()
	require.False(t, g.Running(ticket))
	release <- struct{}{}
	require.NoError(t, <-done)
	<-ended
	require.False(t, g.Covered(ticket), "that sync began before the ticket")

	// One that fails does not cover it, and ends.
	fail.Store(true)
	done = begin()
	require.True(t, g.Running(ticket))
	ended = g.Ended()
	release <- struct{}{}
	require.Error(t, <-done)
	<-ended
	require.False(t, g.Covered(ticket))
	require.False(t, g.Running(ticket))

	// The next that succeeds does.
	fail.Store(false)
	done = begin()
	require.True(t, g.Running(ticket))
	release <- struct{}{}
	require.NoError(t, <-done)
	require.True(t, g.Covered(ticket))
	require.False(t, g.Running(ticket))
}
