package consumer

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// runSubscriber starts a Subscriber with opts (fast backoffs added) on in
// and returns it and a stop that waits for Run to return.
func runSubscriber(t *testing.T, in *Inbox, h Handler, opts SubscriberOptions) (*Subscriber, func()) {
	t.Helper()
	opts.Reconnect = outbox.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	opts.HandlerBackoff = outbox.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}
	opts.KeepAlive, opts.PingTimeout, opts.Logger = 2*time.Second, time.Second, testLogger()
	s, err := NewSubscriber(in, h, opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return s, stop
}

// TestSubscriberMQTT5BothModes: over MQTT 5 the Subscriber applies events
// of a relay in structured mode and of one in binary mode, each exactly
// once through the Inbox, binary data byte for byte; an event of binary
// mode committed whose PUBACK was dropped (a crash) comes again and is
// recognised.
func TestSubscriberMQTT5BothModes(t *testing.T) {
	b := startBroker(t)
	producers := map[outbox.Envelope]*outbox.Outbox{}
	for _, env := range []outbox.Envelope{outbox.EnvelopeCloudEvents, outbox.EnvelopeCloudEventsBinary} {
		ob := openTest(t, outbox.Options{})
		opts := fastRelay()
		opts.Envelope, opts.Source = env, "/till/"+env.String()
		startRelay(t, mqttRelayOn(t, ob, b.url(), opts, outbox.Protocol5))
		producers[env] = ob
	}
	blob := []byte{0, 1, 2, 0xff, '{'}
	commit := func(from, to int) {
		for i := from; i < to; i++ {
			for _, ob := range producers {
				commitOrder(t, ob, "pos/orders", i)
			}
		}
	}
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	opts := SubscriberOptions{Broker: b.url(), ClientID: "consumer-5", Topics: []string{"pos/#"}, Protocol: outbox.Protocol5}

	crashed := make(chan struct{})
	var once sync.Once
	first := opts
	first.beforeAck = func(ev outbox.Event) bool {
		if ev.Source != "/till/binary" || ev.Sequence != 3 {
			return true
		}
		once.Do(func() { close(crashed) })
		return false
	}
	s, stop := runSubscriber(t, in, recordApplied, first)
	eventually(t, 10*time.Second, "connected", func() bool { return s.Stats().Connected })
	require.Equal(t, "5", s.Stats().Protocol)
	commit(1, 3)
	require.NoError(t, producers[outbox.EnvelopeCloudEventsBinary].Transact(context.Background(), func(tx *sql.Tx) error {
		return producers[outbox.EnvelopeCloudEventsBinary].Enqueue(context.Background(), tx, outbox.Message{Topic: "pos/blobs", Payload: blob})
	}))
	select {
	case <-crashed:
	case <-time.After(20 * time.Second):
		var reason string
		db.QueryRow(`SELECT reason FROM inbox_quarantine`).Scan(&reason)
		t.Fatalf("no crash: %+v, quarantined: %s", s.Stats(), reason)
	}
	// The other relay's events may come after the crash: all five are
	// applied before the stop, which would leave them for the next run.
	eventually(t, 10*time.Second, "five applied", func() bool { return appliedCount(t, db) == 5 })
	stop()

	commit(3, 10)
	for _, ob := range producers {
		eventually(t, 10*time.Second, "the relays sent them", func() bool { return countState(t, ob, "pending") == 0 })
	}
	var mu sync.Mutex
	var dups []string
	again := opts
	again.OnEvent = func(ev outbox.Event, outcome Outcome, _ error) {
		if outcome == Duplicate {
			mu.Lock()
			dups = append(dups, fmt.Sprint(ev.Source, " ", ev.Sequence))
			mu.Unlock()
		}
	}
	runSubscriber(t, in, recordApplied, again)
	eventually(t, 10*time.Second, "every event applied", func() bool { return appliedCount(t, db) == 2*9+1 })
	eventually(t, 5*time.Second, "the unacknowledged one came again and was skipped", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range dups {
			if d == "/till/binary 3" {
				return true
			}
		}
		return false
	})
	var distinct int
	require.NoError(t, db.QueryRow(`SELECT count(DISTINCT source || ' ' || id) FROM applied`).Scan(&distinct))
	require.Equal(t, 2*9+1, distinct, "each applied once")
	for _, src := range []string{"/till/cloudevents", "/till/binary"} {
		var data []byte
		require.NoError(t, db.QueryRow(`SELECT data FROM applied WHERE source = ? AND seq = 1`, src).Scan(&data))
		require.Equal(t, `{"n":1}`, string(data), src)
	}
	var data []byte
	require.NoError(t, db.QueryRow(`SELECT data FROM applied WHERE source = '/till/binary' AND seq = 3`).Scan(&data))
	require.Equal(t, blob, data, "binary mode's data untouched")
}

// TestSubscriberAutoFallsBackTo311: auto speaks 3.1.1 to a broker whose
// CONNACK says it has no 5, at once, and to one that closed two MQTT 5
// CONNECTs in a row without a CONNACK; either way the events are applied.
func TestSubscriberAutoFallsBackTo311(t *testing.T) {
	for _, mode := range []harness.GateMode{harness.GateConnack1, harness.GateConnack84, harness.GateClose} {
		t.Run(string(mode), func(t *testing.T) {
			b := startBroker(t)
			g := harness.StartVersionGate(t, b.addr, mode)
			ob := openTest(t, outbox.Options{})
			startRelay(t, mqttRelayOn(t, ob, b.url(), fastRelay(), outbox.Protocol5))
			db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
			in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
			require.NoError(t, err)
			s, _ := runSubscriber(t, in, recordApplied, SubscriberOptions{Broker: g.URL(), ClientID: "consumer-auto", Topics: []string{"pos/#"}})
			eventually(t, 10*time.Second, "connected", func() bool { return s.Stats().Connected })
			require.Equal(t, "3.1.1", s.Stats().Protocol)
			want := int64(1)
			if mode == harness.GateClose {
				want = 2
			}
			require.Equal(t, want, g.V5(), "MQTT 5 CONNECTs before falling back")
			for i := 0; i < 5; i++ {
				commitOrder(t, ob, "pos/orders", i)
			}
			eventually(t, 10*time.Second, "applied", func() bool { return appliedCount(t, db) == 5 })
		})
	}
}

// TestSubscriberSharedSubscription: two Subscribers on one
// $share/group/filter and one Inbox apply every event exactly once between
// them, each some, on mochi and on Mosquitto, on either MQTT version.
func TestSubscriberSharedSubscription(t *testing.T) {
	brokers := map[string]func(t *testing.T) string{
		"mochi": func(t *testing.T) string { return startBroker(t).url() },
		"mosquitto": func(t *testing.T) string {
			return harness.StartMosquitto(t, harness.MosquittoOptions{}).URL()
		},
	}
	for _, name := range []string{"mochi", "mosquitto"} {
		t.Run(name, func(t *testing.T) {
			forProtocols(t, func(t *testing.T, proto outbox.MQTTProtocol) {
				url := brokers[name](t)
				ob := openTest(t, outbox.Options{})
				db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
				in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
				require.NoError(t, err)
				var subs []*Subscriber
				for i := 0; i < 2; i++ {
					s, _ := runSubscriber(t, in, recordApplied, SubscriberOptions{Broker: url, ClientID: fmt.Sprint("member-", i),
						Topics: []string{"$share/g/pos/#"}, Protocol: proto})
					eventually(t, 10*time.Second, "member connected", func() bool { return s.Stats().Connected })
					subs = append(subs, s)
				}
				startRelay(t, mqttRelayOn(t, ob, url, fastRelay(), proto))
				const n = 200
				for i := 0; i < n; i++ {
					commitOrder(t, ob, "pos/orders", i)
				}
				eventually(t, 20*time.Second, "every event applied", func() bool { return appliedCount(t, db) == n })
				var distinct int
				require.NoError(t, db.QueryRow(`SELECT count(DISTINCT id) FROM applied`).Scan(&distinct))
				require.Equal(t, n, distinct, "each applied once")
				// A member counts an event after its Inbox transaction
				// commits, so the count can trail the table for a moment.
				eventually(t, 10*time.Second, "the members' counts add up", func() bool {
					return subs[0].Stats().Applied+subs[1].Stats().Applied == n
				})
				for i, s := range subs {
					st := s.Stats()
					require.Positive(t, st.Applied, "member %d got none", i)
					require.Zero(t, st.Duplicates, "member %d", i)
				}
			})
		})
	}
}

// TestSubscriberSharedSubscriptionValidated: a malformed shared
// subscription is refused by NewSubscriber, before any connection, saying
// what is wrong.
func TestSubscriberSharedSubscriptionValidated(t *testing.T) {
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	for topic, want := range map[string]string{
		"$share//pos/#":   "the group name is empty",
		"$share/g+/pos/#": `the group name "g+" may not hold + or #`,
		"$share/#/pos":    `the group name "#" may not hold + or #`,
		"$share/g":        "no topic filter after the group name",
		"$share/g/":       "no topic filter after the group name",
		"$share":          "want $share/group/filter",
		"":                "an empty topic filter",
	} {
		_, err := NewSubscriber(in, recordApplied, SubscriberOptions{Broker: "tcp://127.0.0.1:1", ClientID: "c", Topics: []string{"pos/#", topic}})
		require.ErrorContains(t, err, want, "%q", topic)
	}
	for _, ok := range []string{"$share/g/pos/#", "$share/group-1/+/orders", "$SYS/broker/load", "pos/+/orders"} {
		_, err := NewSubscriber(in, recordApplied, SubscriberOptions{Broker: "tcp://127.0.0.1:1", ClientID: "c", Topics: []string{ok}})
		require.NoError(t, err, ok)
	}
	_, err = NewSubscriber(in, recordApplied, SubscriberOptions{Broker: "tcp://127.0.0.1:1", ClientID: "c", Topics: []string{"t"}, Protocol: 9})
	require.ErrorContains(t, err, "unknown Protocol")
}
