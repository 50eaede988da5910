package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// prioEvent is a published event's priority and number, from its data.
type prioEvent struct{ P, N int }

// commitPriority commits an event of priority p numbered n, by plain SQL.
func commitPriority(t testing.TB, ob *Outbox, p, n int) {
	t.Helper()
	_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload, priority) VALUES ('t', ?, ?)`, fmt.Sprintf(`{"P":%d,"N":%d}`, p, n), p)
	require.NoError(t, err)
	ob.Notify()
}

// publishedPriorities decodes what pub published, in order.
func publishedPriorities(t testing.TB, pub *fakePublisher) []prioEvent {
	t.Helper()
	pub.mu.Lock()
	defer pub.mu.Unlock()
	out := make([]prioEvent, 0, len(pub.published))
	for _, raw := range pub.published {
		ev, err := DecodeEvent([]byte(raw))
		require.NoError(t, err)
		var e prioEvent
		require.NoError(t, json.Unmarshal(ev.Data, &e))
		out = append(out, e)
	}
	return out
}

// requireCommitOrderPerPriority: every event committed (want: numbers per
// priority, in commit order) published once, in commit order within its
// priority.
func requireCommitOrderPerPriority(t testing.TB, got []prioEvent, want map[int][]int) {
	t.Helper()
	per := map[int][]int{}
	for _, e := range got {
		per[e.P] = append(per[e.P], e.N)
	}
	require.Equal(t, want, per, "each priority's events once, in commit order")
}

// TestRelayPriorityOrder: a backlog of three priorities, committed
// interleaved, goes out highest first and in commit order within each
// priority; the lower priorities have one message in shareEvery while a
// higher one has more, and no more.
func TestRelayPriorityOrder(t *testing.T) {
	ob := openTest(t, Options{})
	want := map[int][]int{}
	pattern := []int{0, 0, 5, 0, 9, 0, 5, 0}
	for n := range 200 {
		p := pattern[n%len(pattern)]
		commitPriority(t, ob, p, n)
		want[p] = append(want[p], n)
	}
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.ReadSize = 16 // several reads per priority
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 10*time.Second, "the backlog", func() bool { return pub.publishedCount() == 200 })
	got := publishedPriorities(t, pub)
	requireCommitOrderPerPriority(t, got, want)
	// Until the last event of a priority, the lower ones have their share
	// (one message in shareEvery) and no more.
	for _, p := range []int{9, 5} {
		last := 0
		for i, e := range got {
			if e.P == p {
				last = i
			}
		}
		lower := 0
		for _, e := range got[:last] {
			if e.P < p {
				lower++
			}
		}
		require.LessOrEqual(t, lower, (last+shareEvery-1)/shareEvery, "below priority %d before its last event: the share only", p)
		require.Positive(t, lower, "below priority %d: a share while it drains", p)
	}
}

// TestRelayPriorityTakesTheNextSlot: a priority-9 event committed while a
// priority-0 backlog fills the window goes out in the next slot that frees,
// not after the rows read before it.
func TestRelayPriorityTakesTheNextSlot(t *testing.T) {
	ob := openTest(t, Options{})
	for n := range 100 {
		commitPriority(t, ob, 0, n)
	}
	pub := &fakePublisher{hold: true}
	opts := fastRelay()
	opts.Window = 4
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 5*time.Second, "a full window", func() bool { return pub.heldCount() == 4 })
	commitPriority(t, ob, 9, 100)
	pub.release(1)
	eventually(t, 5*time.Second, "the next publish", func() bool { return pub.publishedCount() == 5 })
	got := publishedPriorities(t, pub)
	require.Equal(t, prioEvent{P: 9, N: 100}, got[4], "the freed slot's publish")
	eventually(t, 10*time.Second, "the rest", func() bool {
		pub.release(4)
		return pub.publishedCount() == 101 && pub.heldCount() == 0
	})
	want := map[int][]int{9: {100}}
	for n := range 100 {
		want[0] = append(want[0], n)
	}
	requireCommitOrderPerPriority(t, publishedPriorities(t, pub), want)
}

// TestRelayPrioritySuspectWaitsItsTurn: after a connection lost with a
// priority-0 event first in flight (the suspect, retried alone before the
// window opens: the isolation rule), a priority-9 event committed meanwhile
// goes first, alone; the suspect is retried alone when its priority's turn
// comes, charged, and parked dead; the rest follow in commit order.
func TestRelayPrioritySuspectWaitsItsTurn(t *testing.T) {
	ob := openTest(t, Options{})
	for n := range 5 {
		commitPriority(t, ob, 0, n)
	}
	pub := &fakePublisher{}
	var once sync.Once
	var tried []prioEvent // every publish, refused ones too; under pub.mu
	pub.refuse = func(payload []byte) error {
		ev, err := DecodeEvent(payload)
		if err != nil {
			return err
		}
		var e prioEvent
		if err := json.Unmarshal(ev.Data, &e); err != nil {
			return err
		}
		tried = append(tried, e)
		if e != (prioEvent{P: 0, N: 0}) {
			return nil
		}
		once.Do(func() {
			// Committed while the connection is being lost.
			_, err = ob.DB().Exec(`INSERT INTO outbox (topic, payload, priority) VALUES ('t', '{"P":9,"N":100}', 9)`)
		})
		if err != nil {
			return err
		}
		return errors.New("connection reset by peer")
	}
	opts := fastRelay()
	opts.Retry = fastRetry(2)
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 10*time.Second, "the rest delivered", func() bool {
		st, err := ob.Stats(context.Background())
		return err == nil && st.Pending == 0 && st.Dead == 1
	})
	pub.mu.Lock()
	tries := slices.Clone(tried)
	pub.mu.Unlock()
	// The window may carry more of priority 0, or the priority-9 event,
	// beside the suspect's first publish; its retry comes after the latter.
	suspect := prioEvent{P: 0, N: 0}
	require.Equal(t, suspect, tries[0])
	retry := slices.Index(tries[1:], suspect) + 1
	require.Positive(t, retry, "the suspect retried: %v", tries)
	require.Less(t, slices.Index(tries, prioEvent{P: 9, N: 100}), retry, "the priority-9 event goes before the suspect is retried: %v", tries)
	require.GreaterOrEqual(t, slices.Index(tries, prioEvent{P: 9, N: 100}), 0, "the priority-9 event published: %v", tries)
	// Those acknowledged behind the suspect's lost publish go again: first
	// deliveries in order, each at least once.
	first := map[prioEvent]bool{}
	var firsts []prioEvent
	for _, e := range publishedPriorities(t, pub) {
		if !first[e] {
			first[e] = true
			firsts = append(firsts, e)
		}
	}
	requireCommitOrderPerPriority(t, firsts, map[int][]int{9: {100}, 0: {1, 2, 3, 4}})
	var attempts int
	require.NoError(t, ob.DB().QueryRow(`SELECT attempts FROM outbox WHERE payload = '{"P":0,"N":0}' AND dead_at IS NOT NULL`).Scan(&attempts))
	require.Equal(t, 2, attempts, "charged only when alone")
}

// TestRelayPriorityPassesARefusedRetry: a priority-0 event the broker
// refused waits its retry delay (a minute here) with the connection kept,
// and the priority-0 events behind it wait with it; a priority-9 event
// committed meanwhile does not.
func TestRelayPriorityPassesARefusedRetry(t *testing.T) {
	ob := openTest(t, Options{})
	for n := range 3 {
		commitPriority(t, ob, 0, n)
	}
	pub := &fakePublisher{}
	var once sync.Once
	pub.refuse = func(payload []byte) error {
		ev, err := DecodeEvent(payload)
		if err != nil {
			return err
		}
		var e prioEvent
		if err := json.Unmarshal(ev.Data, &e); err != nil || e != (prioEvent{P: 0, N: 0}) {
			return err
		}
		once.Do(func() {
			_, err = ob.DB().Exec(`INSERT INTO outbox (topic, payload, priority) VALUES ('t', '{"P":9,"N":100}', 9)`)
		})
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: quota exceeded", ErrRejected)
	}
	opts := fastRelay()
	opts.Retry = DefaultRetryPolicy{Backoff: Backoff{Initial: time.Minute, Max: time.Minute}}
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 5*time.Second, "the priority-9 event", func() bool {
		return slices.Contains(publishedPriorities(t, pub), prioEvent{P: 9, N: 100})
	})
	require.Equal(t, 1, pub.connectCount(), "on the kept connection")
	// The priority-0 events wait with the refused one (those published
	// beside it are not marked); the priority-9 one is marked sent.
	eventually(t, 5*time.Second, "the priority-9 event marked", func() bool {
		st, err := ob.Stats(context.Background())
		return err == nil && st.Pending == 3
	})
}

// TestRelayWindowBytes: the relay stops handing off while WindowBytes of
// payload await their acknowledgement, so that a priority-9 event committed
// meanwhile waits behind them only, not behind a window of large messages;
// a message larger than WindowBytes goes alone; WindowBytes < 0 leaves
// Window alone.
func TestRelayWindowBytes(t *testing.T) {
	const pad = 100_000 // each message's payload is a little more
	commitLarge := func(t *testing.T, ob *Outbox, n int) {
		_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', ?)`,
			fmt.Sprintf(`{"P":0,"N":%d,"pad":"%s"}`, n, strings.Repeat("x", pad)))
		require.NoError(t, err)
	}
	for _, tc := range []struct {
		name        string
		windowBytes int
		first       int // published before the first acknowledgement
	}{
		{"default", 0, 3},             // 3 × ~100 KB ≥ 256 KiB
		{"larger than it", 50_000, 1}, // each goes alone
		{"off", -1, 10},               // Window (64) alone
	} {
		t.Run(tc.name, func(t *testing.T) {
			ob := openTest(t, Options{})
			for n := range 10 {
				commitLarge(t, ob, n)
			}
			pub := &fakePublisher{hold: true}
			opts := fastRelay()
			opts.WindowBytes = tc.windowBytes
			r, err := ob.NewRelay(pub, opts)
			require.NoError(t, err)
			waits := make(chan int64, 100)
			r.hooks.onWindowBytes = func(n int64) {
				select {
				case waits <- n:
				default:
				}
			}
			startRelay(t, r)
			if tc.windowBytes < 0 {
				eventually(t, 5*time.Second, "all held", func() bool { return pub.heldCount() == 10 })
				require.Empty(t, waits, "no wait for bytes")
			} else {
				limit := int64(cmp.Or(tc.windowBytes, 256<<10))
				select {
				case n := <-waits:
					require.GreaterOrEqual(t, n, limit)
				case <-time.After(5 * time.Second):
					t.Fatal("the relay never waited for WindowBytes")
				}
				// Dispatch is waiting: what it handed off is all it will.
				require.Equal(t, tc.first, pub.publishedCount())
				commitPriority(t, ob, 9, 100)
				pub.release(1)
				eventually(t, 5*time.Second, "the next publish", func() bool { return pub.publishedCount() > tc.first })
				require.Equal(t, prioEvent{P: 9, N: 100}, publishedPriorities(t, pub)[tc.first], "the freed room's publish")
			}
			eventually(t, 10*time.Second, "the rest", func() bool {
				pub.release(10)
				st, err := ob.Stats(context.Background())
				return err == nil && st.Pending == 0
			})
			want := map[int][]int{}
			if tc.windowBytes >= 0 {
				want[9] = []int{100}
			}
			for n := range 10 {
				want[0] = append(want[0], n)
			}
			requireCommitOrderPerPriority(t, publishedPriorities(t, pub), want)
		})
	}
}
