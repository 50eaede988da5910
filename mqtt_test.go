package outbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"

	"github.com/edgeoutbox/outbox/compression"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/mqtt"
)

// TestMQTTFault: what internal/mqtt reports of a failed publish reads, at
// the seam, as whose fault it was (faultOf), with the text last_error keeps.
func TestMQTTFault(t *testing.T) {
	lost := fmt.Errorf("%w: %w", mqtt.ErrDisconnected, errors.New("outbox: mqtt: write: broken pipe"))
	for _, c := range []struct {
		in    error
		fault fault
		text  string
	}{
		{&mqtt.PubackError{Code: 0x87}, faultUndeliverable, "not authorized (0x87)"},
		{&mqtt.PubackError{Code: 0x90, Reason: "Publishing to this topic is forbidden by service policy"}, faultUndeliverable,
			"topic name invalid (0x90): Publishing to this topic is forbidden by service policy"},
		{&mqtt.PubackError{Code: 0x95}, faultUndeliverable, "packet too large (0x95)"},
		{&mqtt.PubackError{Code: 0x99, Reason: "Payload Format Invalid"}, faultUndeliverable, "payload format invalid (0x99)"},
		{&mqtt.PubackError{Code: 0x80, Reason: "quota spent"}, faultMessage, "unspecified error (0x80): quota spent"},
		{&mqtt.PubackError{Code: 0x83}, faultMessage, "implementation specific error (0x83)"},
		{&mqtt.PubackError{Code: 0x97}, faultBroker, "the broker says quota exceeded (0x97)"},
		{&mqtt.PubackError{Code: 0x91}, faultConnection, "outbox: mqtt: the broker says: packet identifier in use (0x91)"},
		{fmt.Errorf("%w: %w", mqtt.ErrDisconnected, &mqtt.DisconnectError{Code: 0x89, Reason: "Server Busy"}), faultBroker,
			"the broker disconnected: server busy (0x89)"},
		{fmt.Errorf("%w: %w", mqtt.ErrDisconnected, &mqtt.DisconnectError{Code: 0x8E}), faultBroker,
			"the broker disconnected: session taken over (0x8E); another client connected with this client id: do two relays share it?"},
		{fmt.Errorf("%w: %w", mqtt.ErrDisconnected, &mqtt.DisconnectError{Code: 0x81}), faultConnection,
			"disconnected before the acknowledgement: the broker disconnected: malformed packet (0x81)"},
		{&mqtt.PacketTooLargeError{Size: 2010, Max: 1024}, faultUndeliverable,
			"packet too large: the message is 2010 bytes as an MQTT packet, over the broker's Maximum Packet Size of 1024 (not sent)"},
		{&mqtt.StallError{Err: lost}, faultStalled, ErrStalled.Error() + ": " + lost.Error()},
		{mqtt.ErrNotConnected, faultNotSent, ErrNotConnected.Error()},
		{lost, faultConnection, lost.Error()},
	} {
		err := mqttFault(c.in)
		require.Equal(t, c.fault, faultOf(err), "%v", c.in)
		require.EqualError(t, err, c.text)
	}
	var ce *mqtt.StallError
	require.False(t, errors.As(mqttFault(&mqtt.StallError{Err: lost}), &ce), "the seam's ErrStalled, not internal/mqtt's")
	require.ErrorIs(t, mqttFault(&mqtt.StallError{Err: lost}), mqtt.ErrDisconnected)
}

// TestMQTTCheckSize: a message is refused for good only when its PUBLISH
// would be over MQTT's largest Remaining Length, properties counted.
func TestMQTTCheckSize(t *testing.T) {
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: "tcp://127.0.0.1:1"})
	require.NoError(t, err)
	const limit = 268_435_455
	topic := "pos/1/orders"
	require.NoError(t, pub.CheckSize(topic, limit-2-len(topic)-2, nil))
	require.Error(t, pub.CheckSize(topic, limit-2-len(topic)-2+1, nil))
	props := &PublishProperties{ContentType: "application/json"} // 1 + 2 + 16 bytes, and their length
	require.NoError(t, pub.CheckSize(topic, limit-2-len(topic)-2-20, props))
	require.ErrorContains(t, pub.CheckSize(topic, limit-2-len(topic)-2-19, props), "exceeds MQTT's limit")
}

// TestRawBatchNeedsMQTT5: over 3.1.1 nothing marks a raw batch or a
// compressed raw payload (no Content Type, no user property, and a raw
// payload may begin with any bytes), so NewRelay refuses either with a raw
// envelope on a publisher that speaks only 3.1.1, or a type embedding one;
// structured events, MQTT 5, auto and other transports are let through.
func TestRawBatchNeedsMQTT5(t *testing.T) {
	ob := openTest(t, Options{})
	mqttPub := func(proto MQTTProtocol) Publisher {
		pub, err := NewMQTTPublisher(MQTTOptions{Broker: "tcp://127.0.0.1:1", Protocol: proto})
		require.NoError(t, err)
		t.Cleanup(func() { pub.Close() })
		return pub
	}
	type wrapped struct{ *MQTTPublisher }
	batch := BatchOptions{MaxEvents: 16}
	for _, c := range []struct {
		name    string
		pub     Publisher
		opts    RelayOptions
		refused bool
	}{
		{"raw batched on 3.1.1", mqttPub(Protocol311), RelayOptions{Envelope: EnvelopeRaw, Batch: batch}, true},
		{"raw compressed on 3.1.1", mqttPub(Protocol311), RelayOptions{Envelope: EnvelopeRaw, Compress: compression.Zstd()}, true},
		{"raw gzip on 3.1.1, embedded", wrapped{mqttPub(Protocol311).(*MQTTPublisher)}, RelayOptions{Envelope: EnvelopeRaw, Compress: compression.Gzip()}, true},
		{"raw unbatched on 3.1.1", mqttPub(Protocol311), RelayOptions{Envelope: EnvelopeRaw, Batch: BatchOptions{MaxEvents: 1}}, false},
		{"structured batched and compressed on 3.1.1", mqttPub(Protocol311), RelayOptions{Batch: batch, Compress: compression.Zstd()}, false},
		{"raw batched and compressed on 5", mqttPub(Protocol5), RelayOptions{Envelope: EnvelopeRaw, Batch: batch, Compress: compression.Zstd()}, false},
		{"raw batched and compressed on auto", mqttPub(ProtocolAuto), RelayOptions{Envelope: EnvelopeRaw, Batch: batch, Compress: compression.Zstd()}, false},
		{"raw batched and compressed, another transport", &fakePublisher{}, RelayOptions{Envelope: EnvelopeRaw, Batch: batch, Compress: compression.Zstd()}, false},
	} {
		_, err := ob.NewRelay(c.pub, c.opts)
		if c.refused {
			require.ErrorContains(t, err, "EnvelopeRaw with Batch or Compress needs MQTT 5", c.name)
			require.ErrorContains(t, err, "use Protocol5 or ProtocolAuto, or EnvelopeCloudEvents", c.name)
		} else {
			require.NoError(t, err, c.name)
		}
	}
}

// BenchmarkMQTTPublish is MQTTPublisher's own cost per message: publishes
// kept 64 deep, as the relay's window does, to a broker in this process
// that only acknowledges (ackBroker), over loopback TCP. Its allocs/op are
// the publisher's: the broker allocates nothing per message.
func BenchmarkMQTTPublish(b *testing.B) {
	binary := PublishProperties{ContentType: "application/json", User: []UserProperty{
		{"specversion", "1.0"}, {"id", "0123456789abcdef01234567"}, {"source", "/till/1"}, {"type", "com.example.order"},
		{"time", "2026-12-04T12:00:00.123Z"}, {"sequence", "00000000000000000042"},
	}}
	for _, c := range []struct {
		name  string
		proto MQTTProtocol
		props *PublishProperties
	}{
		{"5", Protocol5, nil},
		{"5/properties", Protocol5, &binary},
		{"3.1.1", Protocol311, nil},
	} {
		b.Run(c.name, func(b *testing.B) { benchMQTTPublish(b, c.proto, c.props) })
	}
}

func benchMQTTPublish(b *testing.B, proto MQTTProtocol, props *PublishProperties) {
	url := startAckBroker(b)
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: url, ClientID: "bench", Protocol: proto, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Connect(context.Background()); err != nil {
		b.Fatal(err)
	}
	payload := benchPayload(0)
	const window = 64
	var ring [window]Token
	wait := func(t Token) {
		<-t.Done()
		if err := t.Error(); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		if t := ring[i%window]; t != nil {
			wait(t)
		}
		if props != nil {
			ring[i%window] = pub.PublishWithProperties("pos/1/orders", payload, *props)
		} else {
			ring[i%window] = pub.Publish("pos/1/orders", payload)
		}
		i++
	}
	for _, t := range ring {
		if t != nil {
			wait(t)
		}
	}
}

// startAckBroker starts a broker of the least kind on a loopback port: it
// accepts a CONNECT of either version, acknowledges each QoS 1 PUBLISH and
// answers PINGREQs, reusing its buffers; it returns its URL.
func startAckBroker(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); serveAcks(c) }()
		}
	}()
	return "tcp://" + ln.Addr().String()
}

func serveAcks(c net.Conn) {
	r := bufio.NewReaderSize(c, 64<<10)
	w := bufio.NewWriterSize(c, 4<<10)
	body := make([]byte, 0, 64<<10)
	v5 := false
	for {
		first, err := r.ReadByte()
		if err != nil {
			return
		}
		n, shift := 0, 0
		for {
			b, err := r.ReadByte()
			if err != nil {
				return
			}
			n |= int(b&0x7f) << shift
			if b&0x80 == 0 {
				break
			}
			shift += 7
		}
		if cap(body) < n {
			body = make([]byte, n)
		}
		body = body[:n]
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		switch first >> 4 {
		case 1: // CONNECT: "\x00\x04MQTT", then the level
			v5 = len(body) > 6 && body[6] == 5
			if v5 {
				w.Write([]byte{0x20, 3, 0, 0, 0})
			} else {
				w.Write([]byte{0x20, 2, 0, 0})
			}
		case 3: // PUBLISH at QoS 1: the topic, then the packet id
			t := int(body[0])<<8 | int(body[1])
			w.Write([]byte{0x40, 2, body[2+t], body[3+t]})
		case 12: // PINGREQ
			w.Write([]byte{0xD0, 0})
		case 14: // DISCONNECT
			w.Flush()
			return
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}
