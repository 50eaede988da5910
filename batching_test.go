package outbox

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeoutbox/outbox/compression"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/compress"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// unpack reads what the relay published (structured mode, batched or not,
// compressed or not) into events; encoding is the content-encoding
// property, "" for none (over 3.1.1 the magic bytes say it).
func unpack(t testing.TB, payload []byte, encoding string) []Event {
	t.Helper()
	var user []UserProperty
	if encoding != "" {
		user = []UserProperty{{contentEncodingKey, encoding}}
	}
	evs, err := DecodeEventsMQTT(payload, "", user)
	require.NoError(t, err)
	return evs
}

// put enqueues m in a transaction of its own.
func put(t testing.TB, ob *Outbox, m Message) {
	t.Helper()
	require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error { return ob.Enqueue(context.Background(), tx, m) }))
}

// relayStats is r.Stats, for a condition.
func relayStats(t testing.TB, r *Relay) RelayStats {
	t.Helper()
	st, err := r.Stats(context.Background())
	require.NoError(t, err)
	return st
}

// enqueueTopics commits n events round-robin over topics, one transaction
// each, and returns their ids per topic in commit order.
func enqueueTopics(t testing.TB, ob *Outbox, n int, topics ...string) map[string][]string {
	t.Helper()
	want := map[string][]string{}
	for i := range n {
		topic := topics[i%len(topics)]
		id := NewID()
		put(t, ob, Message{ID: id, Topic: topic,
			Payload: fmt.Appendf(nil, `{"order":%d,"store":"s-1","lines":[{"sku":"A-%d","qty":1}]}`, i, i%7)})
		want[topic] = append(want[topic], id)
	}
	return want
}

// perTopic is the ids received per topic, in the order received.
func perTopic(evs []Event, topicOf func(Event) string) map[string][]string {
	got := map[string][]string{}
	for _, ev := range evs {
		got[topicOf(ev)] = append(got[topicOf(ev)], ev.ID)
	}
	return got
}

// TestBatchKeepsEachTopicsOrder: a backlog of three interleaved topics goes
// out in batches of one topic each, every event once, in commit order
// within its topic; the mark never takes a row it did not see acknowledged
// (no row is moved), and nothing is left pending.
func TestBatchKeepsEachTopicsOrder(t *testing.T) {
	ob := openTest(t, Options{})
	want := enqueueTopics(t, ob, 300, "a", "b", "c")
	seqsBefore := outboxSeqs(t, ob.DB())
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.Batch = BatchOptions{MaxEvents: 16}
	opts.Window = 4
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 10*time.Second, "drained", func() bool { return relayStats(t, r).SentSince == 300 })

	pub.mu.Lock()
	published := append([]string(nil), pub.published...)
	pub.mu.Unlock()
	var evs []Event
	topic := map[string]string{}
	for _, p := range published {
		batch := unpack(t, []byte(p), "")
		for _, ev := range batch {
			var body struct{ Order int }
			require.NoError(t, json.Unmarshal(ev.Data, &body))
			topic[ev.ID] = string("abc"[body.Order%3])
		}
		evs = append(evs, batch...)
	}
	require.Equal(t, want, perTopic(evs, func(ev Event) string { return topic[ev.ID] }), "every event once, in commit order within its topic")
	require.LessOrEqual(t, len(published), 300/16+3*4, "batched: %d messages for 300 events", len(published))
	require.Equal(t, seqsBefore, outboxSeqs(t, ob.DB()), "no row moved: the mark only took rows acknowledged")
	require.Zero(t, relayStats(t, r).InFlight)
	st, err := ob.Stats(context.Background())
	require.NoError(t, err)
	require.Zero(t, st.Pending)
}

// TestBatchRefusedGoesOneByOne: a batch the broker refuses for one of its
// events is sent again event by event, so only that event is charged and
// parked dead; the others are delivered, in order.
func TestBatchRefusedGoesOneByOne(t *testing.T) {
	for _, permanent := range []bool{true, false} {
		t.Run(fmt.Sprintf("permanent=%v", permanent), func(t *testing.T) {
			ob := openTest(t, Options{})
			var ids []string
			for i := range 40 {
				id := NewID()
				payload := fmt.Appendf(nil, `{"n":%d}`, i)
				if i == 17 {
					payload = []byte(`{"bad":true}`)
				}
				put(t, ob, Message{ID: id, Topic: "t", Payload: payload})
				ids = append(ids, id)
			}
			pub := &fakePublisher{refuse: func(p []byte) error {
				if strings.Contains(string(p), `"bad":true`) {
					return &Refusal{Reason: "payload format invalid (0x99)", Permanent: permanent}
				}
				return nil
			}}
			opts := fastRelay()
			opts.Batch = BatchOptions{MaxEvents: 10}
			opts.Retry = fastRetry(3)
			r, err := ob.NewRelay(pub, opts)
			require.NoError(t, err)
			startRelay(t, r)
			eventually(t, 10*time.Second, "drained", func() bool { return relayStats(t, r).SentSince == 39 && relayStats(t, r).DeadSince == 1 })

			state, attempts := rowState(t, ob, 18)
			require.Equal(t, "dead", state)
			if permanent {
				require.Equal(t, 1, attempts, "charged once, alone")
			} else {
				require.Equal(t, 3, attempts, "charged alone, as the policy says")
			}
			require.Equal(t, 1, countState(t, ob, "dead"), "only the event at fault")
			pub.mu.Lock()
			published := append([]string(nil), pub.published...)
			pub.mu.Unlock()
			// Batches already in flight behind the refused one reach the
			// broker before it is settled, and go again after it: their
			// last deliveries are in commit order.
			var all []string
			for _, p := range published {
				for _, ev := range unpack(t, []byte(p), "") {
					all = append(all, ev.ID)
				}
			}
			var got []string
			for i, id := range all {
				if !slices.Contains(all[i+1:], id) {
					got = append(got, id)
				}
			}
			wantIDs := append(append([]string(nil), ids[:17]...), ids[18:]...)
			require.Equal(t, wantIDs, got, "the others, in commit order (last deliveries)")
		})
	}
}

// TestBatchMaxDelayGathers: with MaxDelay, events committed one by one
// while the relay waits go out in one message, as soon as the batch is
// full rather than at the deadline.
func TestBatchMaxDelayGathers(t *testing.T) {
	ob := openTest(t, Options{})
	pub := &fakePublisher{}
	opts := fastRelay()
	opts.Batch = BatchOptions{MaxEvents: 5, MaxDelay: 20 * time.Second}
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 5*time.Second, "connected", func() bool { return relayStats(t, r).Connected })
	start := time.Now()
	want := enqueueTopics(t, ob, 5, "t")
	eventually(t, 15*time.Second, "sent", func() bool { return relayStats(t, r).SentSince == 5 })
	require.Less(t, time.Since(start), opts.Batch.MaxDelay, "a full batch does not wait for the deadline")
	require.Equal(t, 1, pub.publishedCount())
	pub.mu.Lock()
	evs := unpack(t, []byte(pub.published[0]), "")
	pub.mu.Unlock()
	require.Equal(t, want["t"], perTopic(evs, func(Event) string { return "t" })["t"])
}

// TestBatchCompressedOnTheWire: over MQTT 5 a batch carries its Content
// Type and the content-encoding user property, an event with an expiry
// goes alone in binary mode; over 3.1.1 a compressed structured batch is
// told by its magic bytes.
func TestBatchCompressedOnTheWire(t *testing.T) {
	for _, tc := range []struct {
		proto MQTTProtocol
		env   Envelope
		comp  Compressor
	}{{Protocol5, EnvelopeCloudEventsBinary, compression.Zstd()}, {Protocol311, EnvelopeCloudEvents, compression.Gzip()}} {
		t.Run(tc.proto.String(), func(t *testing.T) {
			h := &publishSeen{}
			m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(auth.AllowHook), h}})
			ob := openTest(t, Options{})
			want := enqueueTopics(t, ob, 60, "t")
			expiring := NewID()
			put(t, ob, Message{ID: expiring, Topic: "t", Payload: []byte(`{"x":1}`), Expiry: time.Hour})
			want["t"] = append(want["t"], expiring)
			opts := fastRelay()
			opts.Envelope, opts.Compress = tc.env, tc.comp
			opts.Batch = BatchOptions{MaxEvents: 30}
			r, err := ob.NewRelay(testPublisher(t, "tcp://"+m.Addr(), tc.proto), opts)
			require.NoError(t, err)
			startRelay(t, r)
			eventually(t, 10*time.Second, "drained", func() bool { return relayStats(t, r).SentSince == 61 })

			var evs []Event
			seen := h.all()
			require.Len(t, seen, 3, "two batches of 30 and the expiring event alone")
			for i, pk := range seen {
				enc := ""
				for _, u := range pk.Properties.User {
					if u.Key == "content-encoding" {
						enc = u.Val
					}
				}
				if i < 2 {
					if tc.proto == Protocol5 {
						require.Equal(t, batchContentType, pk.Properties.ContentType)
						require.Equal(t, tc.comp.ContentEncoding(), enc)
					} else {
						require.Empty(t, pk.Properties.ContentType)
						require.Equal(t, tc.comp.ContentEncoding(), compress.Sniff(pk.Payload).String())
					}
					evs = append(evs, unpack(t, pk.Payload, enc)...)
					continue
				}
				if tc.proto == Protocol5 {
					require.NotZero(t, pk.Properties.MessageExpiryInterval, "alone, with its own expiry")
					user := make([]UserProperty, len(pk.Properties.User))
					for j, u := range pk.Properties.User {
						user[j] = UserProperty{u.Key, u.Val}
					}
					ev, err := DecodeEventMQTT(pk.Payload, pk.Properties.ContentType, user)
					require.NoError(t, err)
					evs = append(evs, ev)
				} else {
					evs = append(evs, unpack(t, pk.Payload, "")...)
				}
			}
			require.Equal(t, want["t"], perTopic(evs, func(Event) string { return "t" })["t"])
			var raw int
			for _, pk := range seen[:2] {
				raw += len(pk.Payload)
			}
			require.Less(t, raw, 60*150, "compressed: %d bytes for 60 events", raw)
		})
	}
}

// TestBatchRawOverMQTT5: a raw batch is each payload after its length,
// marked by its Content Type; on a 3.1.1 connection raw events go one by
// one, as they are. (NewRelay refuses raw batching on a publisher set to
// Protocol311, TestRawBatchNeedsMQTT5: auto, learning at its connection
// that the broker has no 5, is how a relay comes to speak 3.1.1 with it.)
func TestBatchRawOverMQTT5(t *testing.T) {
	for _, proto := range []MQTTProtocol{Protocol5, Protocol311} {
		t.Run(proto.String(), func(t *testing.T) {
			h := &publishSeen{}
			m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(auth.AllowHook), h}})
			ob := openTest(t, Options{})
			var want []string
			for i := range 20 {
				p := fmt.Sprintf("raw-%d-%s", i, strings.Repeat("x", i*10))
				put(t, ob, Message{Topic: "t", Payload: []byte(p)})
				want = append(want, p)
			}
			opts := fastRelay()
			opts.Envelope = EnvelopeRaw
			opts.Batch = BatchOptions{MaxEvents: 10}
			url, speak := "tcp://"+m.Addr(), proto
			if proto == Protocol311 {
				url, speak = harness.StartVersionGate(t, m.Addr(), harness.GateConnack84).URL(), ProtocolAuto
			}
			r, err := ob.NewRelay(testPublisher(t, url, speak), opts)
			require.NoError(t, err)
			startRelay(t, r)
			eventually(t, 10*time.Second, "drained", func() bool { return relayStats(t, r).SentSince == 20 })
			var got []string
			for _, pk := range h.all() {
				if proto == Protocol311 {
					got = append(got, string(pk.Payload))
					continue
				}
				require.Equal(t, rawBatchContentType, pk.Properties.ContentType)
				for p := pk.Payload; len(p) > 0; {
					n, k := binary.Uvarint(p)
					require.Positive(t, k)
					got = append(got, string(p[k:k+int(n)]))
					p = p[k+int(n):]
				}
			}
			require.Equal(t, want, got)
			if proto == Protocol5 {
				require.Len(t, h.all(), 2)
			} else {
				require.Len(t, h.all(), 20)
			}
		})
	}
}

// TestBatchSyncsLess: with batching, a backlog committed at NORMAL is made
// durable in fewer reads and its marks in fewer syncs: the WAL's fsyncs
// per 1,000 events fall to under half of those without.
func TestBatchSyncsLess(t *testing.T) {
	const n = 3000
	syncsFor := func(b BatchOptions) int64 {
		ob := openTest(t, Options{Synchronous: SyncNormal})
		for i := range n / 100 {
			require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
				for j := range 100 {
					if err := ob.Enqueue(context.Background(), tx, Message{Topic: "t", Payload: fmt.Appendf(nil, `{"n":%d}`, i*100+j)}); err != nil {
						return err
					}
				}
				return nil
			}))
		}
		pub := &fakePublisher{}
		opts := fastRelay()
		opts.Batch = b
		r, err := ob.NewRelay(pub, opts)
		require.NoError(t, err)
		var syncs atomic.Int64
		r.hooks.syncWAL = func() error { syncs.Add(1); return r.wal.Sync() }
		stop := startRelay(t, r)
		eventually(t, 20*time.Second, "drained", func() bool { return relayStats(t, r).SentSince == n })
		stop()
		return syncs.Load()
	}
	plain, batched := syncsFor(BatchOptions{}), syncsFor(BatchOptions{MaxEvents: 100})
	t.Logf("WAL fsyncs per 1,000 events: %.1f unbatched, %.1f in batches of 100", float64(plain)*1000/n, float64(batched)*1000/n)
	require.LessOrEqual(t, 2*batched, plain)
}
