package outbox

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// unavailableBroker is a mochi hook for a broker that says it cannot take
// messages for its own reasons until released: it answers every publish
// with a PUBACK reason code (puback), or disconnects the client with a
// DISCONNECT reason code on every publish (onPublish) or as soon as its
// session is established (onConnect). It counts what it said and records
// when each session was established.
type unavailableBroker struct {
	mochi.HookBase
	puback, onPublish, onConnect packets.Code
	released                     atomic.Bool
	said                         atomic.Int64
	srv                          atomic.Pointer[mochi.Server]
	mu                           sync.Mutex
	sessions                     []time.Time
}

func (h *unavailableBroker) ID() string { return "unavailable" }
func (h *unavailableBroker) Provides(b byte) bool {
	return b == mochi.OnPublish || b == mochi.OnSessionEstablished
}

func (h *unavailableBroker) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	h.mu.Lock()
	h.sessions = append(h.sessions, time.Now())
	h.mu.Unlock()
	if h.onConnect.Code != 0 && !h.released.Load() {
		h.said.Add(1)
		go h.srv.Load().DisconnectClient(cl, h.onConnect)
	}
}

func (h *unavailableBroker) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if h.released.Load() || cl.Properties.Username != nil && string(cl.Properties.Username) == "recorder" {
		return pk, nil
	}
	switch {
	case h.puback.Code != 0:
		h.said.Add(1)
		return pk, h.puback
	case h.onPublish.Code != 0:
		h.said.Add(1)
		h.srv.Load().DisconnectClient(cl, h.onPublish)
		return pk, packets.ErrRejectPacket
	}
	return pk, nil
}

// gaps returns the time between consecutive sessions.
func (h *unavailableBroker) gaps() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []time.Duration
	for i := 1; i < len(h.sessions); i++ {
		out = append(out, h.sessions[i].Sub(h.sessions[i-1]))
	}
	return out
}

func startUnavailableBroker(t *testing.T, h *unavailableBroker) *broker {
	t.Helper()
	m := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{new(auth.AllowHook), h}})
	h.srv.Store(m.Server())
	rec, err := harness.Record(m, "#", decodeDelivery)
	require.NoError(t, err)
	return &broker{srv: m.Server(), addr: m.Addr(), rec: rec}
}

// requireDeliveredInOrder waits until every seq from 1 to n has been
// delivered, and checks that each came once before any duplicate, in
// commit order.
func requireDeliveredInOrder(t *testing.T, b *broker, n int) {
	t.Helper()
	var seqs []int64
	eventually(t, 10*time.Second, "every message delivered", func() bool {
		seqs, _ = firstDeliveries(b.rec)
		return len(seqs) >= n
	})
	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i + 1)
	}
	require.Equal(t, want, seqs, "every message once, in commit order")
}

// requireNothingCharged checks that no row of the first n was charged an
// attempt or parked.
func requireNothingCharged(t *testing.T, ob *Outbox, n int) {
	t.Helper()
	for seq := int64(1); seq <= int64(n); seq++ {
		state, attempts := rowState(t, ob, seq)
		require.NotEqual(t, "dead", state, "seq %d", seq)
		require.Zero(t, attempts, "seq %d: the broker's state is not the message's fault", seq)
	}
}

// TestBrokerUnavailablePuback: a broker that answers every publish with
// PUBACK 0x97 (quota exceeded) holds the queue without charging anyone,
// on the one connection, and says so in Stats, in words, since when; once
// it takes messages again, every one is delivered once, in commit order,
// and the words are gone.
func TestBrokerUnavailablePuback(t *testing.T) {
	h := &unavailableBroker{puback: packets.ErrQuotaExceeded}
	b := startUnavailableBroker(t, h)
	ob := openTest(t, Options{})
	const n = 20
	for i := range n {
		commitOrder(t, ob, "pos/orders", i)
	}
	opts := fastRelay()
	opts.Retry = fastRetry(3)
	r := mqttRelayOn(t, ob, b.url(), opts, Protocol5)
	before := time.Now()
	startRelay(t, r)
	// The first window of n, then messages sent alone: the broker takes
	// them again while none is in flight (one that takes messages again
	// part way through a window takes them out of order; the relay
	// cannot help that).
	eventually(t, 10*time.Second, "the broker said it to a window and to three sent alone", func() bool { return h.said.Load() >= n+3 })
	requireNothingCharged(t, ob, n)
	st, err := r.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, "the broker says quota exceeded (0x97)", st.BrokerUnavailable)
	require.False(t, st.BrokerUnavailableSince.Before(before))
	require.Contains(t, st.LastError, "quota exceeded (0x97)")
	require.Len(t, h.gaps(), 0, "the connection is kept")
	eventually(t, 5*time.Second, "the lease says it, for outboxctl status", func() bool {
		s, err := ob.Stats(context.Background())
		require.NoError(t, err)
		return s.LeaseBrokerUnavailable == st.BrokerUnavailable && s.LeaseBrokerUnavailableSince.Equal(st.BrokerUnavailableSince.Truncate(time.Millisecond))
	})

	h.released.Store(true)
	requireDeliveredInOrder(t, b, n)
	requireNothingCharged(t, ob, n)
	eventually(t, 5*time.Second, "the words gone", func() bool {
		s, err := ob.Stats(context.Background())
		require.NoError(t, err)
		return r.Metrics().BrokerUnavailable == "" && s.LeaseBrokerUnavailable == ""
	})
}

// TestBrokerUnavailableDisconnect: a broker that disconnects the relay on
// every publish with a reason code about itself (server busy, shutting
// down, quota exceeded, session taken over) charges nothing, not even the
// message it sent alone after each reconnect; LastError says what the
// broker said (for 0x8E, that two clients share the client id), and once
// the broker takes messages every one is delivered once, in order.
func TestBrokerUnavailableDisconnect(t *testing.T) {
	for _, c := range []struct {
		code  packets.Code
		words string
	}{
		{packets.ErrServerBusy, "the broker disconnected: server busy (0x89)"},
		{packets.ErrServerShuttingDown, "the broker disconnected: server shutting down (0x8B)"},
		{packets.ErrQuotaExceeded, "the broker disconnected: quota exceeded (0x97)"},
		{packets.ErrSessionTakenOver, "the broker disconnected: session taken over (0x8E): session takeover; another client connected with this client id: do two relays share it?"},
	} {
		t.Run(fmt.Sprintf("0x%02X", c.code.Code), func(t *testing.T) {
			h := &unavailableBroker{onPublish: c.code}
			b := startUnavailableBroker(t, h)
			ob := openTest(t, Options{})
			const n = 5
			for i := range n {
				commitOrder(t, ob, "pos/orders", i)
			}
			opts := fastRelay()
			opts.Retry = fastRetry(2)
			r := mqttRelayOn(t, ob, b.url(), opts, Protocol5)
			startRelay(t, r)
			eventually(t, 10*time.Second, "disconnected six times", func() bool { return h.said.Load() >= 6 })
			requireNothingCharged(t, ob, n)
			eventually(t, 5*time.Second, "what the broker said in LastError", func() bool {
				st, _ := r.Stats(context.Background())
				return strings.Contains(st.LastError, c.words) && st.BrokerUnavailable != ""
			})
			h.released.Store(true)
			requireDeliveredInOrder(t, b, n)
			requireNothingCharged(t, ob, n)
		})
	}
}

// TestReconnectBackoffAfterAcceptedConnection: a connection the broker
// accepted resets the reconnection backoff, even if it carried nothing;
// one the broker ended saying it is busy does not, and the waits grow as
// for any outage. With waits of 100 ms doubling, five reconnections take
// 0.5 s and more when reset, 3.1 s and more when growing.
func TestReconnectBackoffAfterAcceptedConnection(t *testing.T) {
	for _, c := range []struct {
		name  string
		code  packets.Code
		grows bool
	}{
		{"lost", packets.ErrUnspecifiedError, false},
		{"busy", packets.ErrServerBusy, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &unavailableBroker{onConnect: c.code}
			b := startUnavailableBroker(t, h)
			ob := openTest(t, Options{})
			opts := fastRelay()
			opts.Reconnect = Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second, Multiplier: 2, Jitter: -1}
			r := mqttRelayOn(t, ob, b.url(), opts, Protocol5)
			startRelay(t, r)
			eventually(t, 15*time.Second, "six sessions", func() bool { return len(h.gaps()) >= 5 })
			var sum time.Duration
			for _, g := range h.gaps()[:5] {
				sum += g
			}
			t.Logf("five waits: %v in all: %v", sum, h.gaps()[:5])
			if c.grows {
				require.GreaterOrEqual(t, sum, 3100*time.Millisecond, "waits of 100, 200, 400, 800, 1600 ms: %v", h.gaps())
			} else {
				require.Less(t, sum, 2*time.Second, "five waits of 100 ms (3.1 s if they grew): %v", h.gaps())
			}
		})
	}
}

// TestBrokerUnavailableConnack: a broker that refuses connections saying it
// is unavailable (CONNACK 0x89 server busy under MQTT 5, return code 3
// server unavailable under 3.1.1) holds the queue, and Stats says what it
// says; once it accepts, every event is delivered once, in commit order,
// and the words are gone.
func TestBrokerUnavailableConnack(t *testing.T) {
	for _, c := range []struct {
		proto MQTTProtocol
		words string
	}{
		{Protocol5, "server busy (CONNACK 0x89)"},
		{Protocol311, "unavailable (CONNACK 3)"},
	} {
		t.Run(c.proto.String(), func(t *testing.T) {
			var busy atomic.Bool
			busy.Store(true)
			fb := harness.StartFakeBroker(t, harness.FakeBrokerOptions{Connack: func(_ int, level byte) []byte {
				switch {
				case !busy.Load():
					return nil
				case level == 5:
					return []byte{0x20, 3, 0, 0x89, 0}
				}
				return []byte{0x20, 2, 0, 3}
			}})
			ob := openTest(t, Options{})
			const n = 5
			for i := range n {
				commitOrder(t, ob, "pos/orders", i)
			}
			r := mqttRelayOn(t, ob, fb.URL(), fastRelay(), c.proto)
			startRelay(t, r)
			eventually(t, 10*time.Second, "the broker's words in Stats", func() bool {
				st, _ := r.Stats(context.Background())
				return strings.Contains(st.BrokerUnavailable, c.words) && len(fb.Connects()) >= 3
			})
			busy.Store(false)
			eventually(t, 10*time.Second, "every event sent", func() bool { return countState(t, ob, "sent") == n })
			var seqs []int64
			for _, p := range fb.Received() {
				ev, err := DecodeEvent(p.Payload)
				require.NoError(t, err)
				seqs = append(seqs, ev.Sequence)
			}
			require.Equal(t, []int64{1, 2, 3, 4, 5}, seqs, "every event once, in commit order")
			requireNothingCharged(t, ob, n)
			require.Empty(t, r.Metrics().BrokerUnavailable)
		})
	}
}
