package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// The relay's priorities seen from the publisher: the order of its Publish
// calls, counted in messages, with the PUBACKs held so that the window
// fills and nothing depends on time.

// enqueuePriority commits n events of priority prio in one transaction,
// through Enqueue, numbered from first (their data a prioEvent).
func enqueuePriority(t *testing.T, ob *Outbox, prio, first, n int) {
	t.Helper()
	msgs := make([]Message, n)
	for i := range msgs {
		data, err := json.Marshal(prioEvent{P: prio, N: first + i})
		require.NoError(t, err)
		msgs[i] = Message{Topic: "prio/events", Payload: data, Priority: prio}
	}
	ctx := context.Background()
	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }))
}

// requireOrderWithinPriority checks that each priority's events were first
// published in commit order, 1, 2, 3, ..., as far as they went, with
// repeats allowed only of an event already out.
func requireOrderWithinPriority(t *testing.T, evs []prioEvent) {
	t.Helper()
	next := map[int]int{}
	for i, e := range evs {
		if e.N < next[e.P]+1 {
			continue // published again
		}
		require.Equal(t, next[e.P]+1, e.N, "message %d: priority %d's event %d after its event %d", i, e.P, e.N, next[e.P])
		next[e.P] = e.N
	}
}

// TestPriorityShareNoStarvation: priority 9 always has more pending (a
// backlog, and one more committed after every window acknowledged, each
// commit waking the relay while it reads), yet priority 0's events go out,
// at least one message in shareEvery, in commit order.
func TestPriorityShareNoStarvation(t *testing.T) {
	const (
		window  = 4
		flood   = 200 // priority 9, committed first: more than it sends before priority 0's last
		low     = 20  // priority 0, committed after the flood
		maxSent = shareEvery*low + 4*window
	)
	ob := openTest(t, Options{Synchronous: SyncNormal})
	enqueuePriority(t, ob, 9, 1, flood)
	enqueuePriority(t, ob, 0, 1, low)
	pub := &fakePublisher{hold: true}
	opts := fastRelay()
	opts.Window = window
	relay, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, relay)

	next9 := flood + 1
	for {
		// Priority 9 always has more, so the relay fills the window.
		if !harness.WaitFor(10*time.Second, func() bool { return pub.heldCount() == window }) {
			t.Fatalf("no full window after 10 s: %d held, %d published, %d committed of priority 9", pub.heldCount(), pub.publishedCount(), next9-1)
		}
		evs := publishedPriorities(t, pub)
		lows := 0
		for _, e := range evs {
			if e.P == 0 {
				lows++
			}
		}
		if lows >= low || len(evs) >= maxSent {
			break
		}
		pub.release(window)
		enqueuePriority(t, ob, 9, next9, 1)
		next9++
	}

	evs := publishedPriorities(t, pub)
	requireOrderWithinPriority(t, evs)
	var at []int // position (1-based) of each priority-0 event's first publish
	for i, e := range evs {
		if e.P == 0 && e.N == len(at)+1 {
			at = append(at, i+1)
		}
	}
	t.Logf("%d messages published, %d of priority 0; the first at %v, the last at %d", len(evs), len(at), at[:min(5, len(at))], at[len(at)-1:])
	require.Len(t, at, low, "priority 0 starved: %d of its %d events out after %d messages", len(at), low, len(evs))
	for k, pos := range at {
		// The k-th (from 1) in the k-th share, give or take what the
		// window and one read had already taken.
		require.LessOrEqual(t, pos, shareEvery*(k+1)+2*window, "priority 0's event %d published as message %d: less than its share", k+1, pos)
	}
}

// TestPriorityOvertakesBacklog: a priority-9 event committed while a
// priority-0 backlog drains is published within about one window: counted
// in messages published after its commit returned, not in time.
func TestPriorityOvertakesBacklog(t *testing.T) {
	const (
		window  = 16
		backlog = 2000
		before  = 200 // priority 0 published before the commit
	)
	ob := openTest(t, Options{Synchronous: SyncNormal})
	enqueuePriority(t, ob, 0, 1, backlog)
	pub := &fakePublisher{hold: true}
	opts := fastRelay()
	opts.Window = window
	relay, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, relay)

	for pub.publishedCount() < before {
		eventually(t, 10*time.Second, "a full window", func() bool { return pub.heldCount() == window })
		pub.release(window)
	}
	// The window is full: nothing more goes out until a PUBACK.
	eventually(t, 10*time.Second, "a full window", func() bool { return pub.heldCount() == window })
	at := pub.publishedCount()
	enqueuePriority(t, ob, 9, 1, 1)

	// One PUBACK at a time: each frees one slot.
	found := -1
	for found < 0 {
		pub.release(1)
		eventually(t, 10*time.Second, "the slot taken again", func() bool { return pub.heldCount() == window })
		evs := publishedPriorities(t, pub)
		for i := at; i < len(evs); i++ {
			if evs[i].P == 9 {
				found = i
			}
		}
		if found < 0 && len(evs)-at > 4*window {
			t.Fatalf("the priority-9 event, committed after message %d, not published by message %d", at, len(evs))
		}
	}
	evs := publishedPriorities(t, pub)
	requireOrderWithinPriority(t, evs)
	ahead := found - at
	t.Logf("priority 9 committed after %d messages, published as message %d: %d of priority 0 went out before it", at, found+1, ahead)
	require.LessOrEqual(t, ahead, window, fmt.Sprintf("the priority-9 event waited for %d messages, more than a window (%d)", ahead, window))
}
