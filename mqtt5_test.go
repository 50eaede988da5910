package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/mqtt"
)

// answerCode is a mochi hook that answers a publish to a chosen topic with a
// chosen PUBACK reason code (to MQTT 5 clients), and counts connections.
type answerCode struct {
	mochi.HookBase
	codes    map[string]packets.Code
	kick     string      // a publish here gets the client disconnected, once
	kicked   atomic.Bool // with DISCONNECT 0x98
	srv      atomic.Pointer[mochi.Server]
	connects atomic.Int64
	// maxPacket, if set, is announced in the CONNACK as the Maximum Packet
	// Size (mochi enforces its own but does not announce it).
	maxPacket uint32
}

func (h *answerCode) ID() string { return "answer-code" }
func (h *answerCode) Provides(b byte) bool {
	return b == mochi.OnPublish || b == mochi.OnSessionEstablished || b == mochi.OnPacketEncode
}
func (h *answerCode) OnPacketEncode(_ *mochi.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Connack && h.maxPacket > 0 {
		pk.Properties.MaximumPacketSize = h.maxPacket
	}
	return withReasonCode(pk)
}

// withReasonCode gives a PUBACK with a success code other than 0x00 (0x10:
// no matching subscribers) a Reason String, without which mochi leaves the
// code out, and so says 0x00.
func withReasonCode(pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Puback && pk.ReasonCode > 0 && pk.ReasonCode < 0x80 && pk.Properties.ReasonString == "" {
		pk.Properties.ReasonString = "no matching subscribers"
	}
	return pk
}
func (h *answerCode) OnSessionEstablished(*mochi.Client, packets.Packet) { h.connects.Add(1) }
func (h *answerCode) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.TopicName == h.kick && h.kick != "" && h.kicked.CompareAndSwap(false, true) {
		h.srv.Load().DisconnectClient(cl, packets.ErrAdministrativeAction)
		return pk, packets.ErrRejectPacket
	}
	if c, ok := h.codes[pk.TopicName]; ok {
		return pk, c
	}
	return pk, nil
}

// startCodeBroker starts mochi with h (and a hook that lets everyone in)
// and a recorder on every topic.
func startCodeBroker(t *testing.T, h *answerCode, caps func(*mochi.Capabilities)) *broker {
	t.Helper()
	m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(auth.AllowHook), h}, Capabilities: caps})
	h.srv.Store(m.Server())
	rec, err := harness.Record(m, "#", decodeDelivery)
	require.NoError(t, err)
	return &broker{srv: m.Server(), addr: m.Addr(), rec: rec}
}

// TestMQTT5ReasonCodes: each class of PUBACK reason code, on one connection
// kept throughout: 0x10 is success (counted in NoSubscribers); 0x87, 0x90, 0x99 and 0x95 park the
// message dead at the first refusal; 0x83 and 0x80 charge an attempt and
// retry until MaxAttempts (0x97 speaks of the broker: brokerstate_test.go). last_error says the code in words, and the
// messages behind each refusal are delivered in order.
func TestMQTT5ReasonCodes(t *testing.T) {
	cases := []struct {
		code     packets.Code
		attempts int // 0: success
		words    string
	}{
		{packets.CodeNoMatchingSubscribers, 0, ""},
		{packets.ErrNotAuthorized, 1, "not authorized (0x87)"},
		{packets.ErrTopicNameInvalid, 1, "topic name invalid (0x90)"},
		{packets.ErrPayloadFormatInvalid, 1, "payload format invalid (0x99)"},
		{packets.ErrPacketTooLarge, 1, "packet too large (0x95)"},
		{packets.ErrImplementationSpecificError, 3, "implementation specific error (0x83)"},
		{packets.ErrUnspecifiedError, 3, "unspecified error (0x80)"},
	}
	h := &answerCode{codes: map[string]packets.Code{}}
	for i, c := range cases {
		h.codes[fmt.Sprintf("code/%d", i)] = c.code
	}
	b := startCodeBroker(t, h, nil)
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.Retry = fastRetry(3)
	r := mqttRelayOn(t, ob, b.url(), opts, Protocol5)
	// Each coded message between two good ones: seq 1, then per case
	// (coded, good).
	commitOrder(t, ob, "pos/orders", 0)
	for i := range cases {
		commitOrder(t, ob, fmt.Sprintf("code/%d", i), i)
		commitOrder(t, ob, "pos/orders", i)
	}
	startRelay(t, r)
	wantSent := 1 + len(cases)
	for _, c := range cases {
		if c.attempts == 0 {
			wantSent++
		}
	}
	eventually(t, 20*time.Second, "every message settled", func() bool {
		return countState(t, ob, "sent") == wantSent && countState(t, ob, "dead") == 1+2*len(cases)-wantSent
	})
	for i, c := range cases {
		seq := int64(2 + 2*i)
		state, attempts := rowState(t, ob, seq)
		if c.attempts == 0 {
			require.Equal(t, "sent", state, "0x%02X", c.code.Code)
			continue
		}
		require.Equal(t, "dead", state, "0x%02X", c.code.Code)
		require.Equal(t, c.attempts, attempts, "0x%02X", c.code.Code)
		var lastErr string
		require.NoError(t, ob.DB().QueryRow(`SELECT last_error FROM outbox WHERE seq = ?`, seq).Scan(&lastErr))
		require.Equal(t, c.words, lastErr)
	}
	require.EqualValues(t, 1, h.connects.Load(), "a refused message is not an outage: one connection throughout")
	// The good ones, in order (refused ones are not routed; 0x10 ones are
	// mochi's answer after routing).
	var good []int64
	eventually(t, 5*time.Second, "good ones routed", func() bool {
		good = good[:0]
		seqs, _ := firstDeliveries(b.rec)
		for _, s := range seqs {
			if s%2 == 1 {
				good = append(good, s)
			}
		}
		return len(good) == 1+len(cases)
	})
	for i := 1; i < len(good); i++ {
		require.Greater(t, good[i], good[i-1], "in commit order")
	}
	st, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, "5", st.Protocol)
	require.EqualValues(t, 1, st.NoSubscribers, "0x10 is sent, and counted")
	require.Equal(t, "code/0", st.NoSubscribersTopic)
}

// TestMQTT5ReceiveMaximumCapsWindow: with a Window of 64 and a broker that
// announces a Receive Maximum of 4, no more than 4 publishes await their
// PUBACK: with every PUBACK withheld, the broker receives 4 messages and no
// more; once the connection that lost them is cut, the backlog drains.
func TestMQTT5ReceiveMaximumCapsWindow(t *testing.T) {
	h := &answerCode{}
	b := startCodeBroker(t, h, func(c *mochi.Capabilities) { c.ReceiveMaximum = 4 })
	p := harness.StartFaultProxy(t, b.addr)
	ob := openTest(t, Options{})
	opts := fastRelay()
	opts.Window = 64
	opts.AckTimeout = 10 * time.Second // no reconnection while it is watched
	pub := testPublisher(t, p.URL(), Protocol5)
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	eventually(t, 5*time.Second, "connected", func() bool { s, _ := r.Stats(context.Background()); return s.Connected })
	require.Equal(t, 4, pub.MaxInFlight())
	p.Drop(harness.ToClient) // PUBACKs vanish
	const n = 100
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{Topic: "pos/orders", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	require.NoError(t, ob.Transact(context.Background(), func(tx *sql.Tx) error { return ob.Enqueue(context.Background(), tx, msgs...) }))
	eventually(t, 5*time.Second, "the first four at the broker", func() bool { return b.rec.Count() >= 4 })
	// Watched for a while: a window wider than 4 would have sent more by
	// now (it sends 64 at once).
	watch := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(watch) {
		s, err := r.Stats(context.Background())
		require.NoError(t, err)
		require.LessOrEqual(t, s.InFlight, int64(4))
		require.Equal(t, 4, b.rec.Count(), "publishes beyond the broker's Receive Maximum")
		time.Sleep(10 * time.Millisecond)
	}
	p.EndDrop()
	eventually(t, 20*time.Second, "backlog drained", func() bool { return countState(t, ob, "sent") == n })
	checkOrdered(t, b.rec, n)
}

// TestMQTT5MaximumPacketSize: a message larger than the broker's Maximum
// Packet Size is parked dead at once, never sent, and the ones behind it
// flow on.
func TestMQTT5MaximumPacketSize(t *testing.T) {
	h := &answerCode{maxPacket: 1024}
	b := startCodeBroker(t, h, func(c *mochi.Capabilities) { c.MaximumPacketSize = 1024 })
	ob := openTest(t, Options{})
	r := mqttRelayOn(t, ob, b.url(), fastRelay(), Protocol5)
	commitOrder(t, ob, "pos/orders", 1)
	commitBlob(t, ob, "pos/blobs", 2000)
	commitOrder(t, ob, "pos/orders", 3)
	startRelay(t, r)
	eventually(t, 10*time.Second, "two sent, one dead", func() bool {
		return countState(t, ob, "sent") == 2 && countState(t, ob, "dead") == 1
	})
	state, attempts := rowState(t, ob, 2)
	require.Equal(t, "dead", state)
	require.Equal(t, 1, attempts)
	dead, err := ob.List(context.Background(), ListOptions{State: StateDead})
	require.NoError(t, err)
	require.Contains(t, dead[0].LastError, "over the broker's Maximum Packet Size of 1024 (not sent)")
	seqs, _ := firstDeliveries(b.rec)
	require.Equal(t, []int64{1, 3}, seqs)
	require.EqualValues(t, 1, h.connects.Load())
}

// TestMQTT5DisconnectReason: a DISCONNECT with a reason code is said in
// words in Stats.LastError, with a publish in flight and on an idle
// connection; it is an outage, and the message goes again.
func TestMQTT5DisconnectReason(t *testing.T) {
	h := &answerCode{kick: "pos/kick"}
	b := startCodeBroker(t, h, nil)
	ob := openTest(t, Options{})
	pub := testPublisher(t, b.url(), Protocol5)
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	commitOrder(t, ob, "pos/kick", 1)
	startRelay(t, r)
	eventually(t, 10*time.Second, "sent on the next connection", func() bool { return countState(t, ob, "sent") == 1 })
	st, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.Contains(t, st.LastError, "the broker disconnected: administrative action (0x98)")
	_, attempts := rowState(t, ob, 1)
	require.Zero(t, attempts, "a disconnect is an outage, not the message's fault")

	// Idle: nothing in flight to carry the reason.
	eventually(t, 5*time.Second, "connected", func() bool { s, _ := r.Stats(context.Background()); return s.Connected })
	cl, ok := b.srv.Clients.Get(pub.opts.ClientID)
	require.True(t, ok)
	b.srv.DisconnectClient(cl, packets.ErrSessionTakenOver) // its error is the closed connection
	eventually(t, 5*time.Second, "the reason in LastError", func() bool {
		s, _ := r.Stats(context.Background())
		return strings.Contains(s.LastError, "the broker disconnected: session taken over (0x8E)")
	})
}

// TestAutoFallsBackWhenTheBrokerRefuses5: a CONNACK "unsupported protocol
// version" (5.0's 0x84, or the 3.1.1 return code 1 some brokers send) makes
// auto speak 3.1.1 at once, and for the publisher's life: reconnections do
// not try 5 again.
func TestAutoFallsBackWhenTheBrokerRefuses5(t *testing.T) {
	for _, mode := range []harness.GateMode{harness.GateConnack1, harness.GateConnack84} {
		t.Run(string(mode), func(t *testing.T) {
			b := startBroker(t)
			g := harness.StartVersionGate(t, b.addr, mode)
			ob := openTest(t, Options{})
			pub := testPublisher(t, g.URL(), ProtocolAuto)
			r, err := ob.NewRelay(pub, fastRelay())
			require.NoError(t, err)
			commitOrder(t, ob, "pos/orders", 1)
			startRelay(t, r)
			eventually(t, 10*time.Second, "sent", func() bool { return countState(t, ob, "sent") == 1 })
			st, err := r.Stats(context.Background())
			require.NoError(t, err)
			require.Equal(t, "3.1.1", st.Protocol)
			require.Equal(t, "3.1.1", st.LeaseProtocol, "stored with the lease, for status")
			// Another connection: 5 is not tried again.
			pub.Disconnect()
			commitOrder(t, ob, "pos/orders", 2)
			eventually(t, 10*time.Second, "sent after reconnecting", func() bool { return countState(t, ob, "sent") == 2 })
			require.EqualValues(t, 1, g.V5(), "5 tried once")
			require.GreaterOrEqual(t, g.V311(), int64(2))
		})
	}
}

// TestProtocolRequired: Protocol5 against a broker without 5 fails to
// connect and says why; it never falls back.
func TestProtocolRequired(t *testing.T) {
	b := startBroker(t)
	g := harness.StartVersionGate(t, b.addr, harness.GateConnack84)
	pub := testPublisher(t, g.URL(), Protocol5)
	err := pub.Connect(context.Background())
	require.Error(t, err)
	require.True(t, errors.Is(err, mqtt.ErrUnsupportedVersion))
	require.Contains(t, err.Error(), "the broker does not speak MQTT 5 (CONNACK 0x84)")
	require.EqualValues(t, 0, g.V311())
	p, err := ParseMQTTProtocol("3.1.1")
	require.NoError(t, err)
	require.Equal(t, Protocol311, p)
	_, err = ParseMQTTProtocol("6")
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "auto, 5 or 3.1.1"))
}
