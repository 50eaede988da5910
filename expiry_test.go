package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// expiryOutbox opens an outbox whose clock moves only when el is advanced,
// with limits set so that the pending counters are kept (and checked).
func expiryOutbox(t *testing.T, el *harness.FakeElapsed, now func() time.Time) *Outbox {
	t.Helper()
	return openTest(t, Options{MaxPendingMessages: 1000, MaxPendingBytes: 1 << 20, elapsed: el.Elapsed, Now: now})
}

// enqueueExpiring commits one message on topic, with payload {"n":n} and
// the given expiry (0: none).
func enqueueExpiring(t *testing.T, ob *Outbox, topic string, n int, expiry time.Duration) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error {
		return ob.Enqueue(ctx, tx, Message{Topic: topic, Payload: fmt.Appendf(nil, `{"n":%d}`, n), Expiry: expiry})
	}))
}

// expirySeen starts a mochi broker that keeps every PUBLISH it is given.
func expirySeen(t *testing.T) (url string, h *publishSeen) {
	t.Helper()
	h = &publishSeen{}
	m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(auth.AllowHook), h}})
	return "tcp://" + m.Addr(), h
}

// intervals returns the Message Expiry Interval of each PUBLISH seen, by
// topic.
func intervals(h *publishSeen) map[string]uint32 {
	out := map[string]uint32{}
	for _, pk := range h.all() {
		out[pk.TopicName] = pk.Properties.MessageExpiryInterval
	}
	return out
}

// publishedEvents decodes the events a fakePublisher was given, in order.
func publishedEvents(t *testing.T, p *fakePublisher) []Event {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var evs []Event
	for _, payload := range p.published {
		ev, err := DecodeEvent([]byte(payload))
		require.NoError(t, err)
		evs = append(evs, ev)
	}
	return evs
}

// publishedSeqs is the sequence numbers of the events p was given.
func publishedSeqs(t *testing.T, p *fakePublisher) []int64 {
	t.Helper()
	var seqs []int64
	for _, ev := range publishedEvents(t, p) {
		seqs = append(seqs, ev.Sequence)
	}
	return seqs
}

func waitDrained(t *testing.T, ob *Outbox) {
	t.Helper()
	eventually(t, 10*time.Second, "outbox drained", func() bool {
		st, err := ob.Stats(context.Background())
		require.NoError(t, err)
		return st.Pending == 0
	})
}

// TestExpiryIntervalSeenByBroker: under MQTT 5 the broker gets, as the
// Message Expiry Interval, what was left of each message's expiry when it
// was published (rounded up to whole seconds), and none for a message
// without one; under 3.1.1 it gets none, and the messages go all the same.
func TestExpiryIntervalSeenByBroker(t *testing.T) {
	forProtocols(t, func(t *testing.T, proto MQTTProtocol) {
		url, h := expirySeen(t)
		el := &harness.FakeElapsed{}
		ob := expiryOutbox(t, el, nil)
		enqueueExpiring(t, ob, "e/none", 1, 0)
		enqueueExpiring(t, ob, "e/hour", 2, time.Hour)
		enqueueExpiring(t, ob, "e/ten", 3, 10*time.Minute+300*time.Millisecond)
		el.Advance(5 * time.Minute)
		r := mqttRelayOn(t, ob, url, fastRelay(), proto)
		startRelay(t, r)
		eventually(t, 10*time.Second, "three publishes", func() bool { return len(h.all()) == 3 })
		waitDrained(t, ob)
		want := map[string]uint32{"e/none": 0, "e/hour": 3300, "e/ten": 301}
		if proto == Protocol311 {
			want = map[string]uint32{"e/none": 0, "e/hour": 0, "e/ten": 0}
		}
		require.Equal(t, want, intervals(h))
		require.Equal(t, 3, countState(t, ob, "sent"))
	})
}

// TestExpiredMessageParked: a message whose expiry ran out before its turn
// is parked expired — not published, not pending, counted apart from dead,
// listed — and the messages around it are delivered in order; the pending
// counters are right after it and after a requeue, which brings it back
// without its expiry.
func TestExpiredMessageParked(t *testing.T) {
	ctx := context.Background()
	el := &harness.FakeElapsed{}
	ob := expiryOutbox(t, el, nil)
	for n, expiry := range []time.Duration{0, time.Minute, 0, time.Hour, time.Minute, 0} {
		enqueueExpiring(t, ob, "till/orders", n+1, expiry)
	}
	el.Advance(2 * time.Minute)
	pub := &fakePublisher{}
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	stop := startRelay(t, r)
	waitDrained(t, ob)
	eventually(t, 5*time.Second, "four marked sent", func() bool { return countState(t, ob, "sent") == 4 })
	rs, err := r.Stats(ctx)
	require.NoError(t, err)
	stop()
	require.Equal(t, []int64{1, 3, 4, 6}, publishedSeqs(t, pub), "the expired ones are not published and hold nothing back")
	require.EqualValues(t, 2, rs.ExpiredSince)
	require.Zero(t, rs.DeadSince)
	require.Equal(t, int64(2), rs.Expired)
	require.Zero(t, rs.Dead)
	require.Zero(t, rs.Pending)
	require.EqualValues(t, 4, rs.Sent)
	checkCounters(t, ob.DB())

	for _, seq := range []int64{2, 5} {
		state, attempts := rowState(t, ob, seq)
		require.Equal(t, "expired", state)
		require.Zero(t, attempts, "an expiry is not a failed attempt")
	}
	recs, err := ob.List(ctx, ListOptions{State: StateExpired})
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.EqualValues(t, 2, recs[0].Seq)
	require.Equal(t, StateExpired, recs[0].State)
	require.Equal(t, "expired (not published): its expiry ran out 1m0s before its turn", recs[0].LastError)
	require.False(t, recs[0].DeadAt.IsZero(), "when it was parked")
	dead, err := ob.List(ctx, ListOptions{State: StateDead})
	require.NoError(t, err)
	require.Empty(t, dead, "expired is not dead")
	got, err := ob.Get(ctx, recs[1].ID)
	require.NoError(t, err)
	require.Equal(t, StateExpired, got.State)

	// Requeued without its expiry: by RequeueExpired, never by RequeueDead.
	n, err := ob.RequeueDead(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "RequeueDead leaves expired messages alone")
	n, err = ob.Requeue(ctx, recs[0].ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	checkCounters(t, ob.DB())
	n, err = ob.RequeueExpired(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	checkCounters(t, ob.DB())
	st, err := ob.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Pending)
	require.Zero(t, st.Expired)
	var withExpiry int
	require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox WHERE expires_at IS NOT NULL AND seq > 6`).Scan(&withExpiry))
	require.Zero(t, withExpiry, "requeued without its expiry")

	el.Advance(time.Hour) // no expiry left to run out
	r, err = ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	stop = startRelay(t, r)
	waitDrained(t, ob)
	require.Equal(t, []int64{1, 3, 4, 6, 7, 8}, publishedSeqs(t, pub))
	eventually(t, 5*time.Second, "all marked sent", func() bool { return countState(t, ob, "sent") == 6 })
	stop()
	checkCounters(t, ob.DB())

	// Purged like dead ones.
	for n, expiry := range []time.Duration{time.Minute, 0} {
		enqueueExpiring(t, ob, "till/orders", 10+n, expiry)
	}
	el.Advance(2 * time.Minute)
	r, err = ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	startRelay(t, r)
	waitDrained(t, ob)
	require.Equal(t, 1, countState(t, ob, "expired"))
	n, err = ob.PurgeDead(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	checkCounters(t, ob.DB())
}

// TestExpiryCheckedAtItsTurn: expiry is checked just before each hand-off,
// not when the batch is read: a message read while the window was full,
// whose expiry runs out while it waits for a slot, is not published.
func TestExpiryCheckedAtItsTurn(t *testing.T) {
	el := &harness.FakeElapsed{}
	ob := expiryOutbox(t, el, nil)
	enqueueExpiring(t, ob, "t", 1, 0)
	enqueueExpiring(t, ob, "t", 2, time.Minute)
	enqueueExpiring(t, ob, "t", 3, 0)
	pub := &fakePublisher{hold: true}
	opts := fastRelay()
	opts.Window = 1
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 5*time.Second, "the first in flight", func() bool { return pub.heldCount() == 1 })
	el.Advance(2 * time.Minute) // while the second waits for the window
	pub.release(1)
	eventually(t, 5*time.Second, "the third in flight", func() bool { return pub.publishedCount() == 2 && pub.heldCount() == 1 })
	pub.release(1)
	waitDrained(t, ob)
	require.Equal(t, []int64{1, 3}, publishedSeqs(t, pub))
	state, _ := rowState(t, ob, 2)
	require.Equal(t, "expired", state)
	checkCounters(t, ob.DB())
}

// TestExpiryClockJumpForward: a till boots with its clock at 1970 and
// commits a backlog with expiries while the broker is away; NTP then sets
// the clock 56 years forward. Expiry is measured on the outbox clock, which
// only monotonic time moves: nothing expires that has not lived its expiry
// in that time — in the same process and after a restart — and a message
// whose expiry truly ran out while the broker was away is parked expired,
// not published.
func TestExpiryClockJumpForward(t *testing.T) {
	ctx := context.Background()
	boot := time.Date(1970, 1, 1, 0, 5, 0, 0, time.UTC)
	synced := boot.AddDate(56, 0, 0)

	t.Run("same outbox", func(t *testing.T) {
		url, h := expirySeen(t)
		clock := harness.NewFixedClock(boot)
		el := &harness.FakeElapsed{}
		ob := expiryOutbox(t, el, clock.Now)
		for i := 0; i < 10; i++ {
			enqueueExpiring(t, ob, fmt.Sprintf("till/%d", i), i, time.Hour)
		}
		clock.Set(synced)
		el.Advance(10 * time.Minute)
		startRelay(t, mqttRelayOn(t, ob, url, fastRelay(), Protocol5))
		waitDrained(t, ob)
		eventually(t, 10*time.Second, "ten publishes", func() bool { return len(h.all()) == 10 })
		for topic, s := range intervals(h) {
			require.EqualValues(t, 3000, s, topic)
		}
		require.Zero(t, countState(t, ob, "expired"))
	})

	t.Run("after a restart", func(t *testing.T) {
		url, h := expirySeen(t)
		path := filepath.Join(t.TempDir(), "outbox.db")
		clock := harness.NewFixedClock(boot)
		el := &harness.FakeElapsed{}
		ob, err := Open(ctx, path, Options{Logger: testLogger(), Now: clock.Now, elapsed: el.Elapsed})
		require.NoError(t, err)
		enqueueExpiring(t, ob, "till/hour", 1, time.Hour)
		enqueueExpiring(t, ob, "till/forty", 2, 40*time.Minute)
		el.Advance(30 * time.Minute)
		require.NoError(t, ob.Close())

		clock.Set(synced)
		el = &harness.FakeElapsed{}
		ob, err = Open(ctx, path, Options{Logger: testLogger(), Now: clock.Now, elapsed: el.Elapsed})
		require.NoError(t, err)
		t.Cleanup(func() { ob.Close() })
		el.Advance(15 * time.Minute) // 45 minutes in all
		startRelay(t, mqttRelayOn(t, ob, url, fastRelay(), Protocol5))
		waitDrained(t, ob)
		eventually(t, 10*time.Second, "one publish", func() bool { return len(h.all()) == 1 })
		require.Equal(t, map[string]uint32{"till/hour": 900}, intervals(h), "15 minutes left of the hour")
		state, _ := rowState(t, ob, 2)
		require.Equal(t, "expired", state, "40 minutes ran out after 45")
	})

	t.Run("broker away", func(t *testing.T) {
		clock := harness.NewFixedClock(boot)
		el := &harness.FakeElapsed{}
		ob := expiryOutbox(t, el, clock.Now)
		pub := &fakePublisher{connErr: errors.New("connection refused")}
		r, err := ob.NewRelay(pub, fastRelay())
		require.NoError(t, err)
		startRelay(t, r)
		enqueueExpiring(t, ob, "till/orders", 1, time.Hour)
		enqueueExpiring(t, ob, "till/orders", 2, time.Minute)
		enqueueExpiring(t, ob, "till/orders", 3, 0)
		enqueueExpiring(t, ob, "till/orders", 4, 2*time.Hour)
		clock.Set(synced)
		eventually(t, 5*time.Second, "a few refused connects", func() bool { return pub.connectCount() >= 3 })
		el.Advance(61 * time.Minute) // the broker stays away an hour
		pub.mu.Lock()
		pub.connErr = nil
		pub.mu.Unlock()
		waitDrained(t, ob)
		require.Equal(t, []int64{3, 4}, publishedSeqs(t, pub))
		for _, seq := range []int64{1, 2} {
			state, attempts := rowState(t, ob, seq)
			require.Equal(t, "expired", state, "seq %d", seq)
			require.Zero(t, attempts, "an outage charges nothing")
		}
		checkCounters(t, ob.DB())
	})
}

// TestExpiryFromPlainSQL: a writer in another language sets expires_at to
// the stored outbox clock (outbox_state.clock_ms, which the relay keeps up
// to date) plus the message's life in milliseconds.
func TestExpiryFromPlainSQL(t *testing.T) {
	url, h := expirySeen(t)
	el := &harness.FakeElapsed{}
	ob := expiryOutbox(t, el, nil)
	// Before the relay starts: an idle relay's clock stands still
	// (session.idle).
	el.Advance(time.Hour)
	startRelay(t, mqttRelayOn(t, ob, url, fastRelay(), Protocol5))
	eventually(t, 10*time.Second, "the relay stores its clock", func() bool {
		var ms int64
		require.NoError(t, ob.DB().QueryRow(`SELECT clock_ms FROM outbox_state WHERE id = 1`).Scan(&ms))
		return ms == time.Hour.Milliseconds()
	})
	execCounted(t, ob.DB(), `INSERT INTO outbox (topic, payload, expires_at) VALUES
		('sql/minute', '{}', (SELECT clock_ms FROM outbox_state WHERE id = 1) + 60000),
		('sql/gone', '{}', (SELECT clock_ms FROM outbox_state WHERE id = 1) - 1),
		('sql/none', '{}', NULL)`)
	waitDrained(t, ob)
	eventually(t, 10*time.Second, "two publishes", func() bool { return len(h.all()) == 2 })
	require.Equal(t, map[string]uint32{"sql/minute": 60, "sql/none": 0}, intervals(h))
	require.Equal(t, 1, countState(t, ob, "expired"))
	checkCounters(t, ob.DB())
}

// TestExpiryAfterAnIdleSpell: the outbox clock stands still while the relay
// waits with nothing in flight, so an idle relay that renews nothing (it
// hears every commit: see keepLease) and stores no clock still leaves a
// plain-SQL writer's expiry, stamped from the stored clock, whole: an hour
// idle later, a message with a minute to live goes out with a minute.
func TestExpiryAfterAnIdleSpell(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("inotify is Linux's")
	}
	url, h := expirySeen(t)
	el := &harness.FakeElapsed{}
	ob := expiryOutbox(t, el, nil)
	opts := fastRelay()
	opts.LeaseTTL = time.Second
	r := mqttRelayOn(t, ob, url, opts, Protocol5)
	r.hooks.watch.SafetyPoll = 100 * time.Millisecond
	skips := counted(&r.hooks.onSkip)
	startRelay(t, r)
	eventually(t, 10*time.Second, "connected and idle", func() bool { return skips.Load() > 0 })
	el.Advance(time.Hour)
	execCounted(t, ob.DB(), `INSERT INTO outbox (topic, payload, expires_at) VALUES
		('sql/minute', '{}', (SELECT clock_ms FROM outbox_state WHERE id = 1) + 60000)`)
	waitDrained(t, ob)
	eventually(t, 10*time.Second, "one publish", func() bool { return len(h.all()) == 1 })
	require.Equal(t, map[string]uint32{"sql/minute": 60}, intervals(h))
	require.Zero(t, countState(t, ob, "expired"))
}

// TestExpiryClockStoredByEnqueue: an Enqueue of a message with an expiry
// stores the outbox clock once it runs 10 s ahead of the stored one, and an
// Outbox whose own clock lags the stored one (it was opened before another
// process stored a later tick) stamps its expiries from the stored clock:
// a lagging clock must not shorten a message's life.
func TestExpiryClockStoredByEnqueue(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "outbox.db")
	elA, elB := &harness.FakeElapsed{}, &harness.FakeElapsed{}
	a, err := Open(ctx, path, Options{Logger: testLogger(), elapsed: elA.Elapsed})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	b, err := Open(ctx, path, Options{Logger: testLogger(), elapsed: elB.Elapsed})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	stored := func() (ms int64) {
		require.NoError(t, a.DB().QueryRow(`SELECT clock_ms FROM outbox_state WHERE id = 1`).Scan(&ms))
		return ms
	}
	lastExpiry := func() (ms int64) {
		require.NoError(t, a.DB().QueryRow(`SELECT expires_at FROM outbox ORDER BY seq DESC LIMIT 1`).Scan(&ms))
		return ms
	}
	elA.Advance(5 * time.Second)
	enqueueExpiring(t, a, "t", 1, time.Minute)
	require.Zero(t, stored(), "5 s ahead: not stored yet")
	require.EqualValues(t, 65_000, lastExpiry())
	elA.Advance(6 * time.Second)
	enqueueExpiring(t, a, "t", 2, 0)
	require.Zero(t, stored(), "a message without an expiry stores nothing")
	enqueueExpiring(t, a, "t", 3, time.Minute)
	require.EqualValues(t, 11_000, stored())
	require.EqualValues(t, 71_000, lastExpiry())

	enqueueExpiring(t, b, "t", 4, time.Minute+time.Microsecond)
	require.EqualValues(t, 71_001, lastExpiry(), "from the stored clock, not b's (0); rounded up to the millisecond")
}
