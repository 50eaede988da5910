package consumer

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgeoutbox/outbox/compression"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/compress"
)

// The consumer side of batching and compression (docs/batching.md): until
// the relay writes batches, these tests publish the bytes it will write
// with a client of their own, in the test vectors' forms.

// batchDoc is event n of till 1, as the relay encodes it in structured
// mode.
func batchDoc(n int) []byte {
	return fmt.Appendf(nil, `{"specversion":"1.0","id":"ev-%04d","source":"/till/1","type":"order","time":"2026-11-30T10:15:02.123Z",`+
		`"datacontenttype":"application/json","sequence":"%020d","data":{"n":%d}}`, n, n, n)
}

// structured is the structured batch of events from to to-1.
func structured(from, to int) []byte {
	docs := make([][]byte, 0, to-from)
	for n := from; n < to; n++ {
		docs = append(docs, batchDoc(n))
	}
	return append(append([]byte{'['}, bytes.Join(docs, []byte{','})...), ']')
}

func compressWith(t *testing.T, alg compress.Alg, p []byte) []byte {
	t.Helper()
	c, err := compress.NewCompressor(alg)
	require.NoError(t, err)
	defer c.Close()
	return c.Append(nil, p)
}

// batchProps are a structured batch's MQTT 5 properties, compressed with
// alg; over 3.1.1 the publisher leaves them out, as the relay does.
func batchProps(alg compress.Alg) outbox.PublishProperties {
	p := outbox.PublishProperties{ContentType: "application/cloudevents-batch+json"}
	if alg != compress.None {
		p.User = []outbox.UserProperty{{Key: "content-encoding", Value: alg.String()}}
	}
	return p
}

// rawPublisher publishes hand-built messages, each acknowledged before the
// next, speaking proto.
func rawPublisher(t *testing.T, url string, proto outbox.MQTTProtocol) func(topic string, payload []byte, props outbox.PublishProperties) {
	t.Helper()
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: url, ClientID: "hand-" + outbox.NewID()[24:],
		ConnectTimeout: 2 * time.Second, Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, pub.Connect(ctx))
	return func(topic string, payload []byte, props outbox.PublishProperties) {
		t.Helper()
		tok := pub.PublishWithProperties(topic, payload, props)
		select {
		case <-tok.Done():
			require.NoError(t, tok.Error())
		case <-time.After(10 * time.Second):
			t.Fatal("no PUBACK")
		}
	}
}

// appliedIDs are the ids the handler applied, in the order it applied them.
func appliedIDs(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT id FROM applied ORDER BY rowid`)
	require.NoError(t, err)
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

func idsFrom(from, to int) []string {
	var ids []string
	for n := from; n < to; n++ {
		ids = append(ids, fmt.Sprintf("ev-%04d", n))
	}
	return ids
}

// outcomeLog records what OnEvent said, in order.
type outcomeLog struct {
	mu  sync.Mutex
	got []string
}

func (l *outcomeLog) onEvent(ev outbox.Event, o Outcome, _ error) {
	l.mu.Lock()
	l.got = append(l.got, ev.ID+" "+o.String())
	l.mu.Unlock()
}

func (l *outcomeLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

// batchSetup is a broker, a consumer database and its Inbox.
func batchSetup(t *testing.T) (*broker, *sql.DB, *Inbox) {
	b := startBroker(t)
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	return b, db, in
}

// TestSubscriberAppliesBatches: a structured batch, a zstd one, a gzip one
// and a single event are applied event by event, every id once in the
// order published, each its own outcome; over MQTT 5 the content type and
// the content-encoding property say what they are, over 3.1.1 the first
// byte '[' and the magic bytes.
func TestSubscriberAppliesBatches(t *testing.T) {
	forProtocols(t, func(t *testing.T, proto outbox.MQTTProtocol) {
		b, db, in := batchSetup(t)
		var log outcomeLog
		s, _ := runSubscriber(t, in, recordApplied, SubscriberOptions{Broker: b.url(), ClientID: "consumer-b", Topics: []string{"pos/#"},
			Protocol: proto, OnEvent: log.onEvent})
		eventually(t, 10*time.Second, "connected", func() bool { return s.Stats().Connected })
		publish := rawPublisher(t, b.url(), proto)
		publish("pos/orders", structured(1, 11), batchProps(compress.None))
		publish("pos/orders", compressWith(t, compress.Zstd, structured(11, 21)), batchProps(compress.Zstd))
		publish("pos/orders", compressWith(t, compress.Gzip, structured(21, 31)), batchProps(compress.Gzip))
		publish("pos/orders", batchDoc(31), outbox.PublishProperties{ContentType: "application/cloudevents+json"})
		eventually(t, 10*time.Second, "31 applied", func() bool { return appliedCount(t, db) == 31 })
		require.Equal(t, idsFrom(1, 32), appliedIDs(t, db), "every id once, in order")
		eventually(t, 5*time.Second, "31 outcomes", func() bool { return len(log.all()) == 31 })
		for i, o := range log.all() {
			require.Equal(t, fmt.Sprintf("ev-%04d applied", i+1), o)
		}
		st := s.Stats()
		require.EqualValues(t, 31, st.Applied)
		require.Zero(t, st.Quarantined+st.Duplicates)
	})
}

// TestSubscriberBatchHandlerFailsMidway: the handler fails on the 4th event
// of a batch of 8 for as long as it is asked: the message is not
// acknowledged, so the broker delivers it again to the next run, whose
// Inbox skips the 3 applied before (duplicates) and applies the rest: every
// id once, in order.
func TestSubscriberBatchHandlerFailsMidway(t *testing.T) {
	forProtocols(t, func(t *testing.T, proto outbox.MQTTProtocol) {
		b, db, in := batchSetup(t)
		var broken atomic.Bool
		broken.Store(true)
		h := func(ctx context.Context, tx *sql.Tx, ev outbox.Event) error {
			if ev.ID == "ev-0004" && broken.Load() {
				return errors.New("downstream not ready")
			}
			return recordApplied(ctx, tx, ev)
		}
		opts := SubscriberOptions{Broker: b.url(), ClientID: "consumer-m", Topics: []string{"pos/#"}, Protocol: proto}
		var first outcomeLog
		o1 := opts
		o1.OnEvent = first.onEvent
		s, stop := runSubscriber(t, in, h, o1)
		eventually(t, 10*time.Second, "connected", func() bool { return s.Stats().Connected })
		rawPublisher(t, b.url(), proto)("pos/orders", compressWith(t, compress.Zstd, structured(1, 9)), batchProps(compress.Zstd))
		eventually(t, 10*time.Second, "the 4th failing, again", func() bool { return s.Stats().HandlerErrors >= 3 })
		require.Equal(t, idsFrom(1, 4), appliedIDs(t, db), "the three before it applied")
		stop()
		require.Empty(t, first.all(), "nothing acknowledged")

		broken.Store(false)
		var again outcomeLog
		o2 := opts
		o2.OnEvent = again.onEvent
		s2, _ := runSubscriber(t, in, h, o2)
		eventually(t, 10*time.Second, "the batch applied", func() bool { return appliedCount(t, db) == 8 })
		require.Equal(t, idsFrom(1, 9), appliedIDs(t, db), "every id once, in order")
		eventually(t, 5*time.Second, "8 outcomes", func() bool { return len(again.all()) == 8 })
		var want []string
		for n := 1; n <= 8; n++ {
			o := "applied"
			if n < 4 {
				o = "duplicate"
			}
			want = append(want, fmt.Sprintf("ev-%04d %s", n, o))
		}
		require.Equal(t, want, again.all())
		st := s2.Stats()
		require.EqualValues(t, 3, st.Duplicates)
		require.EqualValues(t, 5, st.Applied)
	})
}

// TestSubscriberBatchQuarantinesOneEvent: an event of a batch the Inbox
// refuses (an id over MaxIDBytes) is quarantined alone, its own document
// kept, and the events around it are applied; a message that cannot be
// decoded at all (a batch with one event without an id) is quarantined
// whole, as before.
func TestSubscriberBatchQuarantinesOneEvent(t *testing.T) {
	b, db, in := batchSetup(t)
	var log outcomeLog
	s, _ := runSubscriber(t, in, recordApplied, SubscriberOptions{Broker: b.url(), ClientID: "consumer-q", Topics: []string{"pos/#"},
		Protocol: outbox.Protocol5, OnEvent: log.onEvent})
	eventually(t, 10*time.Second, "connected", func() bool { return s.Stats().Connected })
	long := bytes.Replace(batchDoc(2), []byte("ev-0002"), []byte(strings.Repeat("x", outbox.MaxIDBytes+1)), 1)
	batch := append(append(append(append([]byte{'['}, batchDoc(1)...), ','), long...), ","+string(batchDoc(3))+"]"...)
	noID := bytes.Replace(structured(4, 6), []byte(`"id":"ev-0005",`), nil, 1)
	publish := rawPublisher(t, b.url(), outbox.Protocol5)
	publish("pos/orders", batch, batchProps(compress.None))
	publish("pos/orders", noID, batchProps(compress.None))
	publish("pos/orders", batchDoc(6), outbox.PublishProperties{})
	eventually(t, 10*time.Second, "applied", func() bool { return appliedCount(t, db) == 3 })
	require.Equal(t, []string{"ev-0001", "ev-0003", "ev-0006"}, appliedIDs(t, db))
	eventually(t, 5*time.Second, "outcomes", func() bool { return len(log.all()) == 5 })
	require.Equal(t, []string{"ev-0001 applied", strings.Repeat("x", outbox.MaxIDBytes+1) + " quarantined", "ev-0003 applied", " quarantined", "ev-0006 applied"}, log.all())
	rows, err := db.Query(`SELECT payload, reason FROM inbox_quarantine ORDER BY seq`)
	require.NoError(t, err)
	defer rows.Close()
	var kept [][]byte
	var reasons []string
	for rows.Next() {
		var p []byte
		var r string
		require.NoError(t, rows.Scan(&p, &r))
		kept, reasons = append(kept, p), append(reasons, r)
	}
	require.Equal(t, [][]byte{long, noID}, kept, "the event alone, then the whole message")
	require.Contains(t, reasons[0], "event 2 of 3")
	require.Contains(t, reasons[1], "id, source and type are required (event 2 of a batch)")
	require.EqualValues(t, 2, s.Stats().Quarantined)
}

// TestSubscriberQuarantinesBomb: a zstd frame of 64 MiB of zeros, told by
// its magic bytes (MQTT 3.1.1), is quarantined as decompressing to more
// than MaxBatchBytesLimit, and the event after it is applied. (Over MQTT 5
// the content-encoding property leads to the same bounded decompression:
// TestBatchingVectors' reject-zstd-bomb; what it allocates:
// TestDecodeEventsMQTTBombBounded.)
func TestSubscriberQuarantinesBomb(t *testing.T) {
	var z bytes.Buffer
	w, err := zstd.NewWriter(&z, zstd.WithEncoderConcurrency(1))
	require.NoError(t, err)
	chunk := make([]byte, 1<<20)
	for i := 0; i < 64; i++ {
		w.Write(chunk)
	}
	require.NoError(t, w.Close())
	b, db, in := batchSetup(t)
	s, _ := runSubscriber(t, in, recordApplied, SubscriberOptions{Broker: b.url(), ClientID: "consumer-z", Topics: []string{"pos/#"},
		Protocol: outbox.Protocol311})
	eventually(t, 10*time.Second, "connected", func() bool { return s.Stats().Connected })
	publish := rawPublisher(t, b.url(), outbox.Protocol311)
	publish("pos/orders", z.Bytes(), outbox.PublishProperties{})
	publish("pos/orders", batchDoc(1), outbox.PublishProperties{})
	eventually(t, 20*time.Second, "applied", func() bool { return appliedCount(t, db) == 1 })
	var reason string
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*), max(reason) FROM inbox_quarantine`).Scan(&n, &reason))
	require.Equal(t, 1, n)
	require.Contains(t, reason, "decompresses to more than the limit")
	require.EqualValues(t, 1, s.Stats().Quarantined)
}

// TestSubscriberRawBatches: a Subscriber of the raw envelope hands the
// handler each payload of a raw batch, compressed or not, in order, and a
// single payload whatever it begins with (here gzip's magic bytes, the
// application's own).
func TestSubscriberRawBatches(t *testing.T) {
	b, _, in := batchSetup(t)
	var mu sync.Mutex
	var got []string
	h := func(_ context.Context, _ *sql.Tx, ev outbox.Event) error {
		mu.Lock()
		got = append(got, string(ev.Data))
		mu.Unlock()
		return nil
	}
	s, _ := runSubscriber(t, in, h, SubscriberOptions{Broker: b.url(), ClientID: "consumer-r", Topics: []string{"pos/#"},
		Protocol: outbox.Protocol5, Envelope: outbox.EnvelopeRaw, RawSource: "/raw"})
	eventually(t, 10*time.Second, "connected", func() bool { return s.Stats().Connected })
	frame := func(ps ...string) []byte {
		var b []byte
		for _, p := range ps {
			b = binary.AppendUvarint(b, uint64(len(p)))
			b = append(b, p...)
		}
		return b
	}
	own := compressWith(t, compress.Gzip, []byte("the application's own gzip"))
	rawBatch := outbox.PublishProperties{ContentType: "application/vnd.edgeoutbox.raw-batch"}
	zstdBatch := rawBatch
	zstdBatch.User = []outbox.UserProperty{{Key: "content-encoding", Value: "zstd"}}
	publish := rawPublisher(t, b.url(), outbox.Protocol5)
	publish("pos/raw", frame("a", "", "c"), rawBatch)
	publish("pos/raw", compressWith(t, compress.Zstd, frame(strings.Repeat("d", 300), "e")), zstdBatch)
	publish("pos/raw", own, outbox.PublishProperties{})
	eventually(t, 10*time.Second, "six payloads", func() bool { return s.Stats().Applied == 6 })
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"a", "", "c", strings.Repeat("d", 300), "e", string(own)}, got)
}

// TestSubscriberAppliesRelayBatches: a till's backlog that its relay sends
// in zstd batches of up to 50 (binary mode over MQTT 5, structured over
// 3.1.1) is applied by the Subscriber every event once, in commit order,
// from fewer MQTT messages than events.
func TestSubscriberAppliesRelayBatches(t *testing.T) {
	forProtocols(t, func(t *testing.T, proto outbox.MQTTProtocol) {
		b, db, in := batchSetup(t)
		s, _ := runSubscriber(t, in, recordApplied, SubscriberOptions{Broker: b.url(), ClientID: "consumer-rb", Topics: []string{"pos/#"}, Protocol: proto})
		eventually(t, 10*time.Second, "connected", func() bool { return s.Stats().Connected })
		ob := openTest(t, outbox.Options{})
		const n = 200
		for i := 0; i < n; i++ {
			commitOrder(t, ob, "pos/orders", i)
		}
		var want []string
		rows, err := ob.DB().Query(`SELECT id FROM outbox_messages ORDER BY seq`)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			want = append(want, id)
		}
		require.NoError(t, rows.Close())
		opts := fastRelay()
		opts.Envelope, opts.Compress = outbox.EnvelopeCloudEventsBinary, compression.Zstd()
		opts.Batch = outbox.BatchOptions{MaxEvents: 50}
		// A batch whose PUBACK is late is sent again event by event: on a
		// loaded machine fastRelay's 2 s would be.
		opts.AckTimeout = 10 * time.Second
		startRelay(t, mqttRelayOn(t, ob, b.url(), opts, proto))
		eventually(t, 10*time.Second, "every event applied", func() bool { return appliedCount(t, db) == n })
		require.Equal(t, want, appliedIDs(t, db), "every id once, in commit order")
		require.Less(t, b.rec.Count(), n/10, "batched")
		require.Zero(t, s.Stats().Quarantined)
	})
}
