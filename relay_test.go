package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgeoutbox/outbox/internal/sqlconn"
	"github.com/edgeoutbox/outbox/internal/walwatch"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/edgeoutbox/outbox/internal/harness"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func mqttRelay(t testing.TB, ob *Outbox, brokerURL string, opts RelayOptions) *Relay {
	t.Helper()
	return mqttRelayOn(t, ob, brokerURL, opts, ProtocolAuto)
}

// checkOrdered asserts that first deliveries came in sequence order and
// covered want messages.
func checkOrdered(t *testing.T, rec *recorder, want int) (dups int) {
	t.Helper()
	// mochi sends the PUBACK before it routes the message to subscribers:
	// a row can be marked sent a moment before the recorder has it.
	eventually(t, 10*time.Second, "deliveries routed to the subscriber", func() bool {
		seqs, _ := firstDeliveries(rec)
		return len(seqs) >= want
	})
	seqs, dups := firstDeliveries(rec)
	require.Equal(t, want, len(seqs), "distinct events delivered")
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("first deliveries out of commit order at %d: %d after %d", i, seqs[i], seqs[i-1])
		}
	}
	for _, d := range rec.All() {
		require.NoError(t, d.evErr)
	}
	return dups
}

func TestRelayCommitOrderAndAtomicity(t *testing.T) {
	forProtocols(t, testRelayCommitOrderAndAtomicity)
}

func testRelayCommitOrderAndAtomicity(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	ob := openTest(t, Options{})
	startRelay(t, mqttRelayOn(t, ob, b.url(), fastRelay(), proto))

	const writers, perWriter = 4, 150
	ctx := context.Background()
	var mu sync.Mutex
	committed := map[string]bool{}
	rolledBack := map[string]bool{}
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				id := NewID()
				fail := i%7 == 3
				err := ob.Transact(ctx, func(tx *sql.Tx) error {
					if _, err := tx.Exec(`INSERT INTO orders (item) VALUES (?)`, id); err != nil {
						return err
					}
					if err := ob.Enqueue(ctx, tx, Message{ID: id, Topic: fmt.Sprintf("pos/%d/orders", w), Type: "order.created", Payload: []byte(`{"ok":true}`)}); err != nil {
						return err
					}
					if fail {
						return errors.New("rolled back on purpose")
					}
					return nil
				})
				mu.Lock()
				if fail {
					require.Error(t, err)
					rolledBack[id] = true
				} else {
					require.NoError(t, err)
					committed[id] = true
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	eventually(t, 20*time.Second, "all committed events delivered", func() bool { return b.rec.Count() >= len(committed) })
	dups := checkOrdered(t, b.rec, len(committed))
	require.Zero(t, dups, "no faults, so no duplicates")
	for _, d := range b.rec.All() {
		require.NoError(t, d.evErr)
		require.True(t, committed[d.ev.ID], "delivered event %s was committed", d.ev.ID)
		require.False(t, rolledBack[d.ev.ID], "rolled-back event %s published", d.ev.ID)
		require.Equal(t, "/test/device", d.ev.Source)
		require.Equal(t, "order.created", d.ev.Type)
		require.Equal(t, "application/json", d.ev.DataContentType)
		require.JSONEq(t, `{"ok":true}`, string(d.ev.Data))
	}
	eventually(t, 5*time.Second, "all marked sent", func() bool { return countState(t, ob, "sent") == len(committed) })
}

func TestRelayOutageMidBacklog(t *testing.T) { forProtocols(t, testRelayOutageMidBacklog) }

func testRelayOutageMidBacklog(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	p := harness.StartFaultProxy(t, b.addr)
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.Window = 16
	r := mqttRelayOn(t, ob, p.URL(), opts, proto)
	const backlog = 3000
	for i := 0; i < backlog; i += 100 {
		msgs := make([]Message, 100)
		for j := range msgs {
			msgs[j] = Message{Topic: "pos/orders", Payload: fmt.Appendf(nil, `{"n":%d}`, i+j)}
		}
		require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error { return ob.Enqueue(context.Background(), tx, msgs...) }))
	}
	startRelay(t, r)
	outages := 0
	for _, at := range []int{300, 1200, 2400} {
		eventually(t, 20*time.Second, "progress before the outage", func() bool { return b.rec.Count() >= at })
		p.Down()
		outages++
		eventually(t, 5*time.Second, "relay notices the outage", func() bool {
			s, _ := r.Stats(context.Background())
			return !s.Connected && s.LastError != ""
		})
		// Keep committing while the broker is unreachable.
		for i := 0; i < 20; i++ {
			commitOrder(t, ob, "pos/orders", backlog+outages*100+i)
		}
		require.NoError(t, p.Up())
	}
	total := backlog + 3*20
	eventually(t, 30*time.Second, "backlog drained", func() bool { return countState(t, ob, "sent") == total })
	dups := checkOrdered(t, b.rec, total)
	require.LessOrEqual(t, dups, outages*opts.Window, "duplicates only from messages in flight at a cut")
	require.Zero(t, countState(t, ob, "dead"), "an outage never dead-letters")
	var attempts int
	require.NoError(t, ob.DB().QueryRow(`SELECT coalesce(max(attempts), 0) FROM outbox`).Scan(&attempts))
	require.Zero(t, attempts, "an outage never counts against a message")
}

func TestRelayWithheldPubackIsResent(t *testing.T) { forProtocols(t, testRelayWithheldPubackIsResent) }

func testRelayWithheldPubackIsResent(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	p := harness.StartFaultProxy(t, b.addr)
	ob := openTest(t, Options{})
	startRelay(t, mqttRelayOn(t, ob, p.URL(), fastRelay(), proto))
	commitOrder(t, ob, "pos/orders", 0)
	eventually(t, 10*time.Second, "first message sent", func() bool { return countState(t, ob, "sent") == 1 })

	p.Drop(harness.ToClient) // PUBACKs (and everything else) from the broker vanish
	commitOrder(t, ob, "pos/orders", 1)
	eventually(t, 10*time.Second, "broker received the message", func() bool { return b.rec.Count() == 2 })
	// The broker has it, but no PUBACK came back: it must stay pending.
	state, _ := rowState(t, ob, 2)
	require.Equal(t, "pending", state)

	p.EndDrop() // the connection that lost them is cut
	eventually(t, 10*time.Second, "message resent and acknowledged", func() bool {
		s, _ := rowState(t, ob, 2)
		return s == "sent"
	})
	// mochi acknowledges before it routes: wait for the subscriber's copy.
	eventually(t, 5*time.Second, "resend routed to the subscriber", func() bool { return b.rec.Count() >= 3 })
	all := b.rec.All()
	require.Equal(t, all[1].ev.ID, all[2].ev.ID, "the same event was sent again")
	require.Zero(t, countState(t, ob, "dead"))
}

// TestRelayPoisonMessageRefusedByBroker: under 3.1.1 mochi closes the
// connection on a denied publish, and the isolation rule charges it once per
// connection until it is dead; under 5 it answers PUBACK 0x87, and the
// message is dead at once, on the same connection.
func TestRelayPoisonMessageRefusedByBroker(t *testing.T) {
	forProtocols(t, testRelayPoisonMessageRefusedByBroker)
}

func testRelayPoisonMessageRefusedByBroker(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.Retry = fastRetry(3)
	r := mqttRelayOn(t, ob, b.url(), opts, proto)
	commitOrder(t, ob, "pos/orders", 1)
	commitOrder(t, ob, "denied/orders", 2) // the broker refuses this one
	commitOrder(t, ob, "pos/orders", 3)
	commitOrder(t, ob, "pos/orders", 4)
	startRelay(t, r)
	eventually(t, 20*time.Second, "the rest delivered", func() bool { return countState(t, ob, "sent") == 3 })
	state, attempts := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	dead, err := ob.List(context.Background(), ListOptions{State: StateDead})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.NotEmpty(t, dead[0].LastError)
	if proto == Protocol5 {
		require.Equal(t, 1, attempts, "dead at the first refusal")
		require.Equal(t, "not authorized (0x87)", dead[0].LastError)
	} else {
		require.Equal(t, 3, attempts)
	}
	require.False(t, dead[0].DeadAt.IsZero())
	eventually(t, 5*time.Second, "routed to the subscriber", func() bool { seqs, _ := firstDeliveries(b.rec); return len(seqs) == 3 })
	seqs, _ := firstDeliveries(b.rec)
	require.Equal(t, []int64{1, 3, 4}, seqs)
	s, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, s.Dead)
	require.EqualValues(t, 1, s.DeadSince)

	// Requeued, it is tried again (and refused again).
	n, err := ob.RequeueDead(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	// It went to the end of the queue with a new sequence number.
	eventually(t, 20*time.Second, "dead again", func() bool {
		dead, err := ob.List(context.Background(), ListOptions{State: StateDead})
		require.NoError(t, err)
		return len(dead) == 1 && dead[0].Seq == 5
	})
	n, err = ob.PurgeDead(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

func TestRelayRejectedMessageRetriedThenDead(t *testing.T) {
	ob, pub := relayGoodBadGood(t, fmt.Errorf("%w: 400 bad request", ErrRejected), 4)
	state, attempts := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	require.Equal(t, 4, attempts)
	// 3 may have been handed over behind the rejected 2, before the relay
	// saw 2 fail (the fake completes a rejection at once, so it is a race)
	// and been acknowledged: marks record a high-water mark, so it goes
	// again once 2 is settled — at most one duplicate, after a failure.
	pub.mu.Lock()
	var published []string
	for _, p := range pub.published {
		ev, err := DecodeEvent([]byte(p))
		require.NoError(t, err)
		published = append(published, string(ev.Data))
	}
	pub.mu.Unlock()
	require.Contains(t, [][]string{{`{"n":1}`, `{"n":3}`}, {`{"n":1}`, `{"n":3}`, `{"n":3}`}}, published,
		"good ones: 1 once, 3 once or (handed over behind 2) twice")
}

func TestRelayUnencodableRowDeadAtOnce(t *testing.T) {
	forProtocols(t, testRelayUnencodableRowDeadAtOnce)
}

func testRelayUnencodableRowDeadAtOnce(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	ob := openTest(t, Options{})
	commitOrder(t, ob, "pos/orders", 1)
	// A plain-SQL writer stored a topic that is not UTF-8: it can never be
	// published, so retrying is pointless.
	_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES (CAST(X'61FF' AS TEXT), 'x')`)
	require.NoError(t, err)
	commitOrder(t, ob, "pos/orders", 3)
	startRelay(t, mqttRelayOn(t, ob, b.url(), fastRelay(), proto))
	eventually(t, 10*time.Second, "valid ones sent", func() bool { return countState(t, ob, "sent") == 2 })
	state, attempts := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	require.Equal(t, 1, attempts)
	dead, err := ob.List(context.Background(), ListOptions{State: StateDead})
	require.NoError(t, err)
	require.Contains(t, dead[0].LastError, "UTF-8")
}

func TestRelayDrainsPlainSQLFromAnotherConnection(t *testing.T) {
	forProtocols(t, testRelayDrainsPlainSQLFromAnotherConnection)
}

func testRelayDrainsPlainSQLFromAnotherConnection(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.PollInterval = 5 * time.Millisecond
	startRelay(t, mqttRelayOn(t, ob, b.url(), opts, proto))
	// Another pool on the same file stands for another process: no
	// in-process wake-up, only data_version.
	other, err := sql.Open("sqlite", "file:"+dbPath(t, ob)+"?_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	defer other.Close()
	_, err = other.Exec(`INSERT INTO outbox (topic, payload) VALUES ('shop/1', '{"total": 12.5}')`)
	require.NoError(t, err)
	_, err = other.Exec(`INSERT INTO outbox (topic, payload, type) VALUES ('shop/1', X'DEADBEEF', 'blob.event')`)
	require.NoError(t, err)
	commitOrder(t, ob, "shop/1", 3)
	eventually(t, 5*time.Second, "three delivered", func() bool { return b.rec.Count() == 3 })
	all := b.rec.All()
	require.Equal(t, DefaultEventType, all[0].ev.Type)
	require.Equal(t, "application/json", all[0].ev.DataContentType)
	require.JSONEq(t, `{"total": 12.5}`, string(all[0].ev.Data))
	require.Equal(t, "blob.event", all[1].ev.Type)
	require.Equal(t, "application/octet-stream", all[1].ev.DataContentType)
	require.Equal(t, []byte{0xde, 0xad, 0xbe, 0xef}, all[1].ev.Data)
	require.Equal(t, []int64{1, 2, 3}, []int64{all[0].ev.Sequence, all[1].ev.Sequence, all[2].ev.Sequence})
}

func TestRelayWakesOnTransactWithoutPolling(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.PollInterval = time.Hour // only the in-process wake-up can deliver
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	r.hooks.watch.Subscribe = func(string) (*walwatch.Subscription, error) { return nil, walwatch.ErrNoWatch }
	startRelay(t, r)
	eventually(t, 5*time.Second, "relay connected", func() bool { s, _ := r.Stats(context.Background()); return s.Connected })
	for i := 0; i < 5; i++ {
		commitOrder(t, ob, "t", i)
		eventually(t, 2*time.Second, "delivered after Transact", func() bool { return pub.publishedCount() == i+1 })
	}
}

func TestRelayOutageNeverCounts(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{connErr: errors.New("connection refused")}
	opts := fastRelay()
	opts.Reconnect = Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond}
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	commitOrder(t, ob, "t", 1)
	startRelay(t, r)
	eventually(t, 10*time.Second, "many failed connects", func() bool {
		return pub.connectCount() > 50
	})
	state, attempts := rowState(t, ob, 1)
	require.Equal(t, "pending", state)
	require.Zero(t, attempts)
	s, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.Contains(t, s.LastError, "connection refused")
	require.False(t, s.Connected)
	pub.mu.Lock()
	pub.connErr = nil
	pub.mu.Unlock()
	eventually(t, 5*time.Second, "sent after the outage", func() bool { s, _ := rowState(t, ob, 1); return s == "sent" })
}

func TestRelayReconnectNow(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{connErr: errors.New("network unreachable")}
	opts := fastRelay()
	opts.Reconnect = Backoff{Initial: time.Hour, Max: time.Hour}
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	commitOrder(t, ob, "t", 1)
	startRelay(t, r)
	eventually(t, 5*time.Second, "first connect failed", func() bool { s, _ := r.Stats(context.Background()); return s.LastError != "" })
	pub.mu.Lock()
	pub.connErr = nil
	pub.mu.Unlock()
	r.ReconnectNow()
	eventually(t, 5*time.Second, "sent without waiting an hour", func() bool { s, _ := rowState(t, ob, 1); return s == "sent" })
}

func TestTwoRelaysOneDatabase(t *testing.T) { forProtocols(t, testTwoRelaysOneDatabase) }

func testTwoRelaysOneDatabase(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	path := filepath.Join(t.TempDir(), "shared.db")
	ctx := context.Background()
	open := func() *Outbox {
		ob, err := Open(ctx, path, Options{Logger: testLogger()})
		require.NoError(t, err)
		t.Cleanup(func() { ob.Close() })
		return ob
	}
	// Two Outbox values with their own pools stand for two processes.
	obA, obB := open(), open()
	_, err := obA.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	require.NoError(t, err)
	optsA, optsB := fastRelay(), fastRelay()
	optsA.Owner, optsB.Owner = "relay-a", "relay-b"
	// Nothing here waits for a lease to expire (A releases it): a long one
	// keeps a renewal late on a loaded machine from handing it over, which
	// duplicates (10, once, at fastRelay's 2 s).
	optsA.LeaseTTL, optsB.LeaseTTL = 10*time.Second, 10*time.Second
	relayA := mqttRelayOn(t, obA, b.url(), optsA, proto)
	stopA := startRelay(t, relayA)
	eventually(t, 5*time.Second, "A holds the lease", func() bool { s, _ := obA.Stats(ctx); return s.LeaseOwner == "relay-a" })
	relayB := mqttRelayOn(t, obB, b.url(), optsB, proto)
	startRelay(t, relayB)
	// A third relay in the same process as A is held off as well.
	relayA2 := mqttRelayOn(t, obA, b.url(), RelayOptions{Owner: "relay-a2", LeaseTTL: 10 * time.Second}, proto)
	startRelay(t, relayA2)

	for i := 0; i < 300; i++ {
		ob := obA
		if i%2 == 1 {
			ob = obB
		}
		commitOrder(t, ob, "pos/orders", i)
	}
	eventually(t, 10*time.Second, "all delivered", func() bool { return countState(t, obA, "sent") == 300 })
	require.Zero(t, checkOrdered(t, b.rec, 300), "one relay at a time: no duplicates")
	sB, err := relayB.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, sB.SentSince, "B waited")

	stopA() // releases the lease: B (or A2) takes over without waiting a TTL
	for i := 300; i < 400; i++ {
		commitOrder(t, obB, "pos/orders", i)
	}
	eventually(t, 10*time.Second, "delivered by the successor", func() bool { return countState(t, obA, "sent") == 400 })
	require.Zero(t, checkOrdered(t, b.rec, 400))
}

func TestLeaseTakenOverAfterCrash(t *testing.T) {
	ob := openTest(t, Options{})
	// A relay that crashed left its lease behind.
	_, err := ob.DB().Exec(`INSERT INTO outbox_lease (name, owner, token, expires_at) VALUES ('relay', 'crashed', 7, 0)`)
	require.NoError(t, err)
	commitOrder(t, ob, "t", 1)
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.LeaseTTL = 300 * time.Millisecond
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	start := time.Now()
	startRelay(t, r)
	eventually(t, 5*time.Second, "sent after takeover", func() bool { s, _ := rowState(t, ob, 1); return s == "sent" })
	require.GreaterOrEqual(t, time.Since(start), opts.LeaseTTL, "waited a whole TTL before taking over")
}

func TestLeaseLostStopsRelay(t *testing.T) {
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.LeaseTTL = 200 * time.Millisecond
	r, err := ob.NewRelay(&fakePublisher{}, opts)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	eventually(t, 5*time.Second, "lease held", func() bool { s, _ := ob.Stats(context.Background()); return s.LeaseOwner != "" })
	_, err = ob.DB().Exec(`UPDATE outbox_lease SET owner = 'usurper'`)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrLeaseLost)
	case <-time.After(5 * time.Second):
		t.Fatal("relay kept running without its lease")
	}
}

func TestRetention(t *testing.T) {
	ctx := context.Background()
	t.Run("sent rows purged after retention", func(t *testing.T) {
		ob := openTest(t, Options{})
		opts := fastRelay()
		opts.Retention = 50 * time.Millisecond
		opts.PurgeInterval = 10 * time.Millisecond
		r, err := ob.NewRelay(&fakePublisher{}, opts)
		require.NoError(t, err)
		stop := startRelay(t, r)
		for i := 0; i < 50; i++ {
			commitOrder(t, ob, "t", i)
		}
		eventually(t, 5*time.Second, "rows purged", func() bool {
			var n int
			require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox`).Scan(&n))
			return n == 0
		})
		st, err := ob.Stats(ctx)
		require.NoError(t, err)
		require.Zero(t, st.Pending)
		require.Zero(t, st.Sent)
		// With every row gone, the next ones still get new numbers, in
		// order, from Enqueue and from plain SQL alike.
		stop()
		commitOrder(t, ob, "t", 51)
		_, err = ob.DB().Exec(`INSERT INTO outbox (topic, payload) VALUES ('t', 'x'), ('t', 'y')`)
		require.NoError(t, err)
		recs, err := ob.List(ctx, ListOptions{})
		require.NoError(t, err)
		require.Len(t, recs, 3)
		for i, rec := range recs {
			require.EqualValues(t, 51+i, rec.Seq, "sequence numbers are never reused")
		}
	})
	t.Run("clock jumped back", func(t *testing.T) {
		var mu sync.Mutex
		clock := time.Now()
		now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
		ob := openTest(t, Options{Now: now})
		opts := fastRelay()
		opts.Retention = time.Hour
		opts.PurgeInterval = 10 * time.Millisecond
		r, err := ob.NewRelay(&fakePublisher{}, opts)
		require.NoError(t, err)
		startRelay(t, r)
		commitOrder(t, ob, "t", 1)
		commitOrder(t, ob, "t", 2)
		eventually(t, 5*time.Second, "sent", func() bool { return countState(t, ob, "sent") == 2 })
		require.Equal(t, 2, countState(t, ob, "sent"), "kept within retention")
		mu.Lock()
		clock = clock.Add(-48 * time.Hour) // the RTC was reset
		mu.Unlock()
		eventually(t, 5*time.Second, "purged although sent in the clock's future", func() bool { return countState(t, ob, "sent") == 0 })
	})
	t.Run("delete on ack", func(t *testing.T) {
		ob := openTest(t, Options{})
		opts := fastRelay()
		opts.Retention = -1
		pub := &fakePublisher{}
		r, err := ob.NewRelay(pub, opts)
		require.NoError(t, err)
		startRelay(t, r)
		for i := 0; i < 20; i++ {
			commitOrder(t, ob, "t", i)
		}
		eventually(t, 5*time.Second, "rows deleted", func() bool {
			var n int
			require.NoError(t, ob.DB().QueryRow(`SELECT count(*) FROM outbox`).Scan(&n))
			return n == 0 && pub.publishedCount() == 20
		})
	})
	t.Run("the file gives space back", func(t *testing.T) {
		ob := openTest(t, Options{})
		payload := make([]byte, 4000)
		for i := 0; i < 20; i++ {
			msgs := make([]Message, 100)
			for j := range msgs {
				msgs[j] = Message{Topic: "t", Payload: payload}
			}
			require.NoError(t, ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }))
		}
		pages := func() (n int64) {
			require.NoError(t, ob.DB().QueryRow(`PRAGMA page_count`).Scan(&n))
			return n
		}
		full := pages()
		opts := fastRelay()
		opts.Retention = time.Millisecond
		opts.PurgeInterval = 10 * time.Millisecond
		r, err := ob.NewRelay(&fakePublisher{}, opts)
		require.NoError(t, err)
		startRelay(t, r)
		eventually(t, 60*time.Second, "file shrinks", func() bool { return pages() < full/4 })
	})
}

func TestShutdownWaitsForInFlight(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{hold: true}
	opts := fastRelay()
	opts.ShutdownTimeout = 500 * time.Millisecond
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	for i := 0; i < 10; i++ {
		commitOrder(t, ob, "t", i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	eventually(t, 5*time.Second, "all ten in flight", func() bool { return pub.heldCount() == 10 })
	cancel()
	pub.release(4) // acknowledgements that arrive during shutdown still count
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within the shutdown timeout")
	}
	require.Equal(t, 4, countState(t, ob, "sent"))
	require.Equal(t, 6, countState(t, ob, "pending"), "unacknowledged messages stay pending")
	s, err := ob.Stats(context.Background())
	require.NoError(t, err)
	require.Empty(t, s.LeaseOwner, "lease released on shutdown")
	pub.Disconnect() // complete the abandoned tokens
}

func TestCloseStopsRelays(t *testing.T) {
	ob := openTest(t, Options{})
	r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	eventually(t, 5*time.Second, "relay running", func() bool { s, _ := r.Stats(context.Background()); return s.Connected })
	require.NoError(t, ob.Close())
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not stop the relay")
	}
}

func TestRelayRawEnvelope(t *testing.T) { forProtocols(t, testRelayRawEnvelope) }

func testRelayRawEnvelope(t *testing.T, proto MQTTProtocol) {
	b := startBroker(t)
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.Envelope = EnvelopeRaw
	startRelay(t, mqttRelayOn(t, ob, b.url(), opts, proto))
	payload := []byte{0x00, 0x01, 'r', 'a', 'w', 0xff}
	require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
		return ob.Enqueue(context.Background(), tx, Message{Topic: "raw/1", Payload: payload})
	}))
	eventually(t, 5*time.Second, "delivered", func() bool { return b.rec.Count() == 1 })
	d := b.rec.All()[0]
	require.Equal(t, "raw/1", d.topic)
	require.Equal(t, payload, d.payload, "payload bytes untouched")
}

func TestOptionChecks(t *testing.T) {
	ob := openTest(t, Options{})
	for _, w := range []int{-1, 65536} {
		_, err := ob.NewRelay(&fakePublisher{}, RelayOptions{Window: w})
		require.Error(t, err, "window %d", w)
	}
	_, err := ob.NewRelay(nil, RelayOptions{})
	require.Error(t, err)
	_, err = New(context.Background(), ob.DB(), Options{MaxPayloadBytes: MaxPayloadBytesLimit + 1})
	require.Error(t, err)
	for _, u := range []string{"", "http://h:1", "tcp://h", "tcp://:1883", "::bad"} {
		_, err := NewMQTTPublisher(MQTTOptions{Broker: u})
		require.Error(t, err, "broker %q", u)
	}
	for _, u := range []string{"tcp://h:1883", "mqtt://h:1883", "ssl://h:8883", "tls://h:8883", "mqtts://h:8883"} {
		_, err := NewMQTTPublisher(MQTTOptions{Broker: u})
		require.NoError(t, err, "broker %q", u)
	}
	_, err = NewMQTTPublisher(MQTTOptions{Broker: "http://user:secret@h:1"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret", "credentials never in errors")
	e, err := ParseEnvelope("raw")
	require.NoError(t, err)
	require.Equal(t, EnvelopeRaw, e)
	_, err = ParseEnvelope("xml")
	require.Error(t, err)
}

func TestRelayOnCallerDBWithoutBusyTimeout(t *testing.T) {
	// A caller's pool without a busy timeout: the relay's marks must still
	// wait for the application's write transactions instead of failing.
	path := filepath.Join(t.TempDir(), "own.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_txlock=immediate")
	require.NoError(t, err)
	defer db.Close()
	ob, err := New(context.Background(), db, Options{Logger: testLogger()})
	require.NoError(t, err)
	defer ob.Close()
	pub := &fakePublisher{}
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	startRelay(t, r)
	for i := 0; i < 50; i++ {
		require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
			return ob.Enqueue(context.Background(), tx, Message{Topic: "t"})
		}))
	}
	eventually(t, 10*time.Second, "all sent", func() bool { return countState(t, ob, "sent") == 50 })
	s, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.Empty(t, s.LastError)
}

func TestRelayLeavesNoSettingsInThePool(t *testing.T) {
	// The relay runs its own connections at synchronous=NORMAL; after it
	// stops, the application's connections must still be FULL.
	ob := openTest(t, Options{})
	ob.DB().SetMaxOpenConns(3)
	ob.DB().SetMaxIdleConns(3)
	r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
	require.NoError(t, err)
	stop := startRelay(t, r)
	commitOrder(t, ob, "t", 1)
	eventually(t, 5*time.Second, "sent", func() bool { return countState(t, ob, "sent") == 1 })
	stop()
	ctx := context.Background()
	var conns []*sql.Conn
	for i := 0; i < 3; i++ {
		c, err := ob.DB().Conn(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
		var sync int
		require.NoError(t, c.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&sync))
		require.Equal(t, 2, sync, "connection %d is FULL", i)
	}
	for _, c := range conns {
		c.Close()
	}
}

// TestRunStoppedWhileStarting: a relay whose context ends while it opens
// its connections returns nil, as for any stop (it returned "outbox: relay:
// context canceled", which failed TestEndToEndKillBothSides in CI once).
func TestRunStoppedWhileStarting(t *testing.T) {
	ob := openTest(t, Options{})
	r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, r.Run(ctx))
}

// TestPurgeRestsWhileNothingIsKept: once a purge leaves no sent row kept,
// the next purges are not run until a message is marked sent; with sent
// rows kept (retention not over) they run at every interval.
func TestPurgeRestsWhileNothingIsKept(t *testing.T) {
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.Retention = time.Hour
	opts.PurgeInterval = 10 * time.Millisecond
	pub := &fakePublisher{}
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	purges := counted(&r.hooks.onPurge)
	startRelay(t, r)
	eventually(t, 5*time.Second, "a first purge", func() bool { return purges.Load() >= 1 })
	start, n := time.Now(), purges.Load()
	eventually(t, 5*time.Second, "half a second", func() bool { return time.Since(start) >= 500*time.Millisecond })
	require.Equal(t, n, purges.Load(), "purges with nothing kept")

	commitOrder(t, ob, "t", 1)
	eventually(t, 5*time.Second, "sent", func() bool { return countState(t, ob, "sent") == 1 })
	eventually(t, 5*time.Second, "purges while a sent row is kept", func() bool { return purges.Load() >= n+5 })
}

// TestPurgeTakesTheWriteLockInAGap: the purge writes on the relay's own
// connection, which the marks need, so it polls for the write lock as
// they do: against a writer that lets the lock go for about a millisecond
// every 90 ms it gets in within a few gaps, not seconds later in SQLite's
// busy handler.
func TestPurgeTakesTheWriteLockInAGap(t *testing.T) {
	ctx := context.Background()
	ob := openTest(t, Options{})
	for i := 0; i < 5; i++ {
		commitOrder(t, ob, "t", i)
	}
	// Sent: what a relay leaves.
	_, err := ob.DB().Exec(`UPDATE outbox_state SET sent_seq = (SELECT max(seq) FROM outbox), sent_seq_0 = (SELECT max(seq) FROM outbox), sent_at = 1000`)
	require.NoError(t, err)
	rc, err := sqlconn.Open(ctx, ob.DB())
	require.NoError(t, err)
	defer rc.Close()
	locked := holdWriteLockInBursts(t, dbPath(t, ob), 90*time.Millisecond)
	for i := 0; i < 3; i++ {
		locked()
		start := time.Now()
		cuts, err := sentCuts(ctx, ob.DB(), time.Now().UnixMilli(), math.MaxInt64)
		require.NoError(t, err)
		_, err = purgeSent(ctx, rc, cuts)
		took := time.Since(start)
		t.Logf("purge %d took %s", i, took.Round(time.Millisecond))
		require.NoError(t, err)
		require.Less(t, took, 3*time.Second, "a purge against a writer that lets the lock go for a millisecond every 90 ms")
	}
	require.Zero(t, countState(t, ob, "sent"))
}

// TestFailureWritesTakeTheWriteLockInAGap: the writes for a message's own
// failure — an attempt charged, parked dead, parked expired — are on the
// relay's connection too, and poll for the write lock as the marks do.
func TestFailureWritesTakeTheWriteLockInAGap(t *testing.T) {
	ob, r, rc := failureSetup(t)
	locked := holdWriteLockInBursts(t, dbPath(t, ob), 90*time.Millisecond)
	for _, w := range failureWrites(r, rc, "refused") {
		locked()
		start := time.Now()
		err := w.write()
		took := time.Since(start)
		t.Logf("%s took %s", w.name, took.Round(time.Millisecond))
		require.NoError(t, err, w.name)
		require.Less(t, took, 3*time.Second, "%s against a writer that lets the lock go for a millisecond every 90 ms", w.name)
	}
	state, attempts := rowState(t, ob, 1)
	require.Equal(t, "pending", state)
	require.Equal(t, 1, attempts)
	state, _ = rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	state, _ = rowState(t, ob, 3)
	require.Equal(t, "expired", state)
}

// failureSetup is an outbox with three pending rows, a relay of it that
// does not run, and a relay connection of its own, closed when the test
// ends.
func failureSetup(t *testing.T) (*Outbox, *Relay, *sqlconn.Conn) {
	t.Helper()
	ob := openTest(t, Options{})
	for i := 0; i < 3; i++ {
		commitOrder(t, ob, "t", i)
	}
	r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
	require.NoError(t, err)
	rc, err := sqlconn.Open(context.Background(), ob.DB())
	require.NoError(t, err)
	t.Cleanup(rc.Close)
	holdLease(t, r, rc)
	return ob, r, rc
}

// failureWrites are the writes for a message's own failure, on rows 1 to 3:
// an attempt charged, parked dead, parked expired; each says why.
func failureWrites(r *Relay, rc *sqlconn.Conn, why string) []struct {
	name  string
	write func() error
} {
	return []struct {
		name  string
		write func() error
	}{
		{"charge", func() error { _, _, _, err := r.charge(rc, 1, errors.New(why)); return err }},
		{"park dead", func() error { return r.park(rc, parking{seq: 2, reason: why, charge: true}) }},
		{"park expired", func() error { return r.park(rc, parking{seq: 3, reason: why, expired: true}) }},
	}
}

// TestParkSeesAFullDisk: parking a message dead or expired, and charging
// it, are writes like the marks, and a full disk says ErrDiskFull there too
// (the relay then spends its reserve and frees space, as for a mark).
func TestParkSeesAFullDisk(t *testing.T) {
	ctx := context.Background()
	ob, r, rc := failureSetup(t)
	// No page more for this connection: a reason too long for its row's
	// page needs overflow pages, which SQLite reports as a full disk.
	require.NoError(t, rc.Do(func(c *sql.Conn) error {
		_, err := c.ExecContext(ctx, `PRAGMA max_page_count = 1`)
		return err
	}))
	for _, w := range failureWrites(r, rc, strings.Repeat("x", 64<<10)) {
		err := w.write()
		require.ErrorIs(t, err, ErrDiskFull, w.name)
	}
	for seq := int64(1); seq <= 3; seq++ {
		state, attempts := rowState(t, ob, seq)
		require.Equal(t, "pending", state)
		require.Zero(t, attempts)
	}
}

// sizedPublisher is a fakePublisher whose protocol carries messages of at
// most limit bytes.
type sizedPublisher struct {
	*fakePublisher
	limit int
}

func (p *sizedPublisher) CheckSize(topic string, payloadBytes int, _ *PublishProperties) error {
	if payloadBytes > p.limit {
		return fmt.Errorf("%d bytes, over this transport's %d", payloadBytes, p.limit)
	}
	return nil
}

// TestRelayAsksThePublisherForItsSizeLimit: the relay sizes a row with the
// Publisher's rules, not its own: a message its SizeLimiter says can never
// be carried is parked dead at once, with the reason, and the rest flows.
func TestRelayAsksThePublisherForItsSizeLimit(t *testing.T) {
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.Envelope = EnvelopeRaw
	pub := &sizedPublisher{fakePublisher: &fakePublisher{}, limit: 100}
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	for i, n := range []int{10, 101, 100} {
		require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
			return ob.Enqueue(context.Background(), tx, Message{Topic: "t", Payload: bytes.Repeat([]byte{'a' + byte(i)}, n)})
		}))
	}
	startRelay(t, r)
	eventually(t, 10*time.Second, "the two that fit sent", func() bool { return countState(t, ob, "sent") == 2 })
	state, attempts := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	require.Equal(t, 1, attempts)
	dead, err := ob.List(context.Background(), ListOptions{State: StateDead})
	require.NoError(t, err)
	require.Equal(t, "101 bytes, over this transport's 100", dead[0].LastError)
	pub.mu.Lock()
	defer pub.mu.Unlock()
	require.Equal(t, []string{strings.Repeat("a", 10), strings.Repeat("c", 100)}, pub.published)
}

// TestRelaySourceChecked: a Source (or DefaultType) that is not valid
// UTF-8 is a clear error at start. It was taken, and then every scrape of
// /metrics answered 200 with nothing in it (client_golang refuses the
// outbox_info label), so an alert on outbox_connected could never fire.
func TestRelaySourceChecked(t *testing.T) {
	ob := openTest(t, Options{})
	for _, o := range []RelayOptions{{Source: "/till/\xff"}, {Source: "/till\x00/7"}, {Source: strings.Repeat("s", 1025)}, {DefaultType: "a\xffb"}} {
		_, err := ob.NewRelay(&fakePublisher{}, o)
		require.Error(t, err, "%+v", o)
		require.Regexp(t, `Source|DefaultType`, err.Error())
	}
	_, err := ob.NewRelay(&fakePublisher{}, RelayOptions{Source: "/shops/Zürich/till-7"})
	require.NoError(t, err)
}

// TestRunReturnsNilAtDeadline: a relay run under context.WithTimeout
// returns nil when the deadline passes, as Run's doc says (it returned
// "context deadline exceeded", so a first program exited through log.Fatal).
func TestRunReturnsNilAtDeadline(t *testing.T) {
	ob := openTest(t, Options{})
	r, err := ob.NewRelay(&fakePublisher{}, fastRelay())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.NoError(t, r.Run(ctx))
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
}
