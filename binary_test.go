package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	mpackets "github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// userProps converts mochi's user properties to the package's.
func userProps(in []mpackets.UserProperty) []UserProperty {
	out := make([]UserProperty, len(in))
	for i, u := range in {
		out[i] = UserProperty{u.Key, u.Val}
	}
	return out
}

// TestRelayBinaryModeMQTT5: in binary mode on MQTT 5 the broker gets the
// payload untouched (JSON, bytes, text), the datacontenttype as the Content
// Type and every other attribute as a user property named by it, the
// sequence zero-padded; DecodeEventMQTT reads back what was enqueued.
func TestRelayBinaryModeMQTT5(t *testing.T) {
	h := &publishSeen{}
	m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(auth.AllowHook), h}})
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.Envelope = EnvelopeCloudEventsBinary
	r := mqttRelayOn(t, ob, "tcp://"+m.Addr(), opts, Protocol5)
	msgs := []Message{
		{Topic: "pos/orders", Payload: []byte(` {"n": 1} `), Type: "com.example.order.created"},
		{Topic: "pos/blobs", Payload: []byte{0, 1, 2, 0xff, '"'}},
		{Topic: "pos/text", Payload: []byte("Bon 17: 2 × Kaffee"), ContentType: "text/plain; charset=utf-8", ID: "receipt-17"},
		{Topic: "pos/empty"},
	}
	require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error { return ob.Enqueue(context.Background(), tx, msgs...) }))
	startRelay(t, r)
	eventually(t, 10*time.Second, "all sent", func() bool { return countState(t, ob, "sent") == len(msgs) })
	listed, err := ob.List(context.Background(), ListOptions{State: StateSent})
	require.NoError(t, err)
	require.Len(t, listed, len(msgs))

	seen := h.all()
	require.Len(t, seen, len(msgs))
	wantCT := []string{"application/json", "application/octet-stream", "text/plain; charset=utf-8", "application/octet-stream"}
	wantType := []string{"com.example.order.created", DefaultEventType, DefaultEventType, DefaultEventType}
	for i, pk := range seen {
		require.Equal(t, msgs[i].Topic, pk.TopicName)
		require.Equal(t, msgs[i].Payload, []byte(pk.Payload), "message %d: the payload untouched", i)
		require.Equal(t, wantCT[i], pk.Properties.ContentType, "message %d", i)
		id := listed[i].ID
		at := listed[i].CreatedAt.UTC().Format("2006-01-02T15:04:05.000Z")
		require.Equal(t, []mpackets.UserProperty{
			{Key: "specversion", Val: "1.0"},
			{Key: "id", Val: id},
			{Key: "source", Val: "/test/device"},
			{Key: "type", Val: wantType[i]},
			{Key: "time", Val: at},
			{Key: "sequence", Val: fmt.Sprintf("%020d", i+1)},
		}, pk.Properties.User, "message %d", i)

		ev, err := DecodeEventMQTT(pk.Payload, pk.Properties.ContentType, userProps(pk.Properties.User))
		require.NoError(t, err)
		require.Equal(t, Event{ID: id, Source: "/test/device", Type: wantType[i], Time: listed[i].CreatedAt.Truncate(time.Millisecond).UTC(),
			DataContentType: wantCT[i], Data: pk.Payload, Sequence: int64(i + 1)}, ev)
	}
	require.Equal(t, "receipt-17", listed[2].ID)
}

// TestRelayBinaryModeStructuredWithoutProperties: binary mode on a
// connection that cannot carry properties — MQTT 3.1.1, or a Publisher
// without PropertiesPublisher — publishes structured mode and says so once,
// however often it reconnects.
func TestRelayBinaryModeStructuredWithoutProperties(t *testing.T) {
	const said = "CloudEvents binary mode needs MQTT 5 properties"
	t.Run("mqtt 3.1.1", func(t *testing.T) {
		b := startBroker(t)
		var logs harness.LogBuffer
		ob := openTest(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		opts := fastRelay()
		opts.Envelope = EnvelopeCloudEventsBinary
		pub := testPublisher(t, b.url(), Protocol311)
		r, err := ob.NewRelay(pub, opts)
		require.NoError(t, err)
		startRelay(t, r)
		for i := 1; i <= 3; i++ {
			commitOrder(t, ob, "pos/orders", i)
			eventually(t, 10*time.Second, "sent", func() bool { return countState(t, ob, "sent") == i })
			// Another connection each time: the fallback is said once.
			pub.Disconnect()
		}
		eventually(t, 10*time.Second, "reconnected", func() bool { return strings.Count(logs.String(), "outbox relay connected") >= 3 })
		for _, d := range b.rec.All() {
			require.NoError(t, d.evErr, "structured mode: %s", d.payload)
		}
		require.Equal(t, 3, b.rec.Count())
		require.Equal(t, 1, strings.Count(logs.String(), said), "%s", logs.String())
		require.Contains(t, logs.String(), "the connection speaks MQTT 3.1.1")
	})
	t.Run("publisher without properties", func(t *testing.T) {
		var logs harness.LogBuffer
		ob := openTest(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		opts := fastRelay()
		opts.Envelope = EnvelopeCloudEventsBinary
		pub := &fakePublisher{}
		r, err := ob.NewRelay(pub, opts)
		require.NoError(t, err)
		startRelay(t, r)
		commitOrder(t, ob, "pos/orders", 1)
		eventually(t, 10*time.Second, "sent", func() bool { return countState(t, ob, "sent") == 1 })
		pub.mu.Lock()
		payload := []byte(pub.published[0])
		pub.mu.Unlock()
		ev, err := DecodeEvent(payload)
		require.NoError(t, err, "structured mode: %s", payload)
		require.Equal(t, `{"n":1}`, string(ev.Data))
		require.Equal(t, 1, strings.Count(logs.String(), said), "%s", logs.String())
		require.Contains(t, logs.String(), "the Publisher cannot send MQTT 5 properties")
	})
}

// TestBinaryModeMaximumPacketSizeCountsProperties: the broker's Maximum
// Packet Size is checked against the packet as sent in binary mode, user
// properties and all: a payload of 900 bytes fits in 1,024 alone but not
// with its attributes, and is parked dead unsent; one of 600 goes.
func TestBinaryModeMaximumPacketSizeCountsProperties(t *testing.T) {
	h := &answerCode{maxPacket: 1024}
	b := startCodeBroker(t, h, func(c *mochi.Capabilities) { c.MaximumPacketSize = 1024 })
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.Envelope = EnvelopeCloudEventsBinary
	r := mqttRelayOn(t, ob, b.url(), opts, Protocol5)
	for _, n := range []int{600, 900, 600} {
		require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error {
			return ob.Enqueue(context.Background(), tx, Message{Topic: "pos/blobs", Payload: bytes.Repeat([]byte{0xab}, n)})
		}))
	}
	startRelay(t, r)
	eventually(t, 10*time.Second, "two sent, one dead", func() bool {
		return countState(t, ob, "sent") == 2 && countState(t, ob, "dead") == 1
	})
	state, _ := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	dead, err := ob.List(context.Background(), ListOptions{State: StateDead})
	require.NoError(t, err)
	require.Contains(t, dead[0].LastError, "over the broker's Maximum Packet Size of 1024 (not sent)")
	require.Equal(t, 2, b.rec.Count())
}

func TestParseEnvelopeBinary(t *testing.T) {
	for _, s := range []string{"binary", "Binary", "cloudevents-binary"} {
		e, err := ParseEnvelope(s)
		require.NoError(t, err)
		require.Equal(t, EnvelopeCloudEventsBinary, e)
		require.Equal(t, "binary", e.String())
	}
	_, err := ParseEnvelope("xml")
	require.ErrorContains(t, err, "want cloudevents, binary or raw")
}

// TestDecodeEventMQTT: binary mode when the user properties carry
// specversion, structured mode otherwise (whatever the content type), and
// the errors of each.
func TestDecodeEventMQTT(t *testing.T) {
	attrs := []UserProperty{{"specversion", "1.0"}, {"id", "e1"}, {"source", "/till/1"}, {"type", "t"},
		{"time", "2026-03-01T12:00:00.123Z"}, {"sequence", "00000000000000000042"}, {"traceparent", "x"}}
	ev, err := DecodeEventMQTT([]byte{0xff, 0}, "application/octet-stream", attrs)
	require.NoError(t, err)
	require.Equal(t, Event{ID: "e1", Source: "/till/1", Type: "t", Time: time.Date(2026, 3, 1, 12, 0, 0, 123e6, time.UTC),
		DataContentType: "application/octet-stream", Data: []byte{0xff, 0}, Sequence: 42}, ev)

	doc := []byte(`{"specversion":"1.0","id":"e2","source":"/till/1","type":"t","data":{"n":1}}`)
	for _, ct := range []string{"", "application/cloudevents+json", "application/json"} {
		ev, err = DecodeEventMQTT(doc, ct, []UserProperty{{"traceparent", "x"}})
		require.NoError(t, err)
		require.Equal(t, "e2", ev.ID, "structured mode")
		require.Equal(t, `{"n":1}`, string(ev.Data))
	}

	for _, c := range []struct {
		user []UserProperty
		err  string
	}{
		{[]UserProperty{{"specversion", "0.3"}, {"id", "1"}, {"source", "s"}, {"type", "t"}}, "unsupported specversion"},
		{[]UserProperty{{"specversion", "1.0"}, {"source", "s"}, {"type", "t"}}, "id, source and type are required"},
		{[]UserProperty{{"specversion", "1.0"}, {"id", "1"}, {"id", "2"}, {"source", "s"}, {"type", "t"}}, `attribute "id" given twice`},
		{[]UserProperty{{"specversion", "1.0"}, {"id", "1"}, {"source", "s"}, {"type", "t"}, {"time", "yesterday"}}, "time"},
		{[]UserProperty{{"specversion", "1.0"}, {"id", "1"}, {"source", "s"}, {"type", "t"}, {"sequence", "x"}}, "sequence"},
	} {
		_, err := DecodeEventMQTT([]byte("x"), "text/plain", c.user)
		require.ErrorContains(t, err, c.err, "%+v", c.user)
	}
	_, err = DecodeEventMQTT([]byte("x"), "", nil)
	require.ErrorContains(t, err, "decode event", "not structured mode either")
}
