package natsjs_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// prioEvent is the data of an event of priority P, the N-th of its
// priority in commit order.
type prioEvent struct {
	P int `json:"p"`
	N int `json:"n"`
}

func enqueuePriority(t *testing.T, ob *outbox.Outbox, prio, n int) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		data, err := json.Marshal(prioEvent{P: prio, N: i + 1})
		require.NoError(t, err)
		msgs[i] = outbox.Message{Topic: "pos/events", Payload: data, Priority: prio}
	}
	ctx := context.Background()
	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }))
}

// TestPrioritiesHoldOnJetStream: priority-9 events committed while a
// priority-0 backlog drains into the stream reach it ahead of most of the
// backlog pending at their commit, and the stream holds every event once,
// each priority in commit order.
func TestPrioritiesHoldOnJetStream(t *testing.T) {
	const (
		backlog = 2000
		urgent  = 20
	)
	s := startJS(t)
	st := s.stream(t, "POS", "pos.>")
	ob := openOutbox(t)
	enqueuePriority(t, ob, 0, backlog)
	runRelay(t, ob, newPublisher(t, s.url), outbox.EnvelopeCloudEvents)
	ctx := context.Background()
	count := func() int {
		info, err := st.Info(ctx)
		require.NoError(t, err)
		return int(info.State.Msgs)
	}
	waitFor(t, 10*time.Second, "the backlog draining", func() bool { return count() >= 100 })
	enqueuePriority(t, ob, 9, urgent)
	at := count() // the stream held at most this many when the commit returned
	waitFor(t, 20*time.Second, "every event in the stream", func() bool { return count() == backlog+urgent })

	var got []prioEvent
	for _, m := range stored(t, st) {
		ev, err := outbox.DecodeEvent(m.Data)
		require.NoError(t, err)
		var e prioEvent
		require.NoError(t, json.Unmarshal(ev.Data, &e))
		got = append(got, e)
	}
	per := map[int][]int{}
	first, last := -1, -1
	for i, e := range got {
		per[e.P] = append(per[e.P], e.N)
		if e.P == 9 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	want := map[int][]int{0: make([]int, backlog), 9: make([]int, urgent)}
	for p, ns := range want {
		for i := range ns {
			ns[i] = i + 1
		}
		want[p] = ns
	}
	require.Equal(t, want, per, "every event once, each priority in commit order")
	t.Logf("priority 9 committed with %d in the stream; its events at %d to %d of %d", at, first+1, last+1, len(got))
	require.Less(t, last, backlog-1, "priority 9 ahead of the backlog's tail")
	// How many go between the commit and the relay's noticing it is the
	// drain's rate times a wake-up's delay (TestRelayPriorityTakesTheNextSlot
	// bounds the slots, with no clock): the bound here leaves a loaded
	// machine tens of milliseconds, while the backlog's order would put
	// priority 9 after all of it.
	require.Less(t, first-at, (backlog-at)/2, "priority 9's first event behind most of the backlog pending at its commit")
}
