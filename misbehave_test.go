package outbox

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestMisbehavingBroker: a relay publishing to a broker that breaks the
// protocol on its first two connections and behaves from the third. Nothing
// is parked dead, every committed event reaches the broker once on the
// connection that behaves, in commit order, and LastError and the relay's
// warn log say what the broker did.
func TestMisbehavingBroker(t *testing.T) {
	bad := func(n int) bool { return n <= 2 }
	cases := []struct {
		name     string
		versions []MQTTProtocol
		opts     harness.FakeBrokerOptions
		lastErr  string // in LastError and the warn log
		acked    bool   // the broker's PUBLISHes acknowledged, and nothing wrong said
		from     int    // the connection from which the broker takes events; 0: 3
	}{
		{
			name:     "3-byte PUBACK 0x87",
			versions: []MQTTProtocol{Protocol311}, // on MQTT 5 it is a refusal
			opts: harness.FakeBrokerOptions{Answer: func(n int, p harness.FakePublish) harness.FakeAnswer {
				if bad(n) {
					return harness.FakeAnswer{Raw: []byte{0x40, 3, byte(p.ID >> 8), byte(p.ID), 0x87}}
				}
				return harness.FakeAnswer{}
			}},
			lastErr: "malformed PUBACK",
		},
		{
			name:     "QoS 1 PUBLISH to the publisher",
			versions: []MQTTProtocol{Protocol311, Protocol5},
			opts: harness.FakeBrokerOptions{AfterConnack: func(n int, level byte) []byte {
				if !bad(n) {
					return nil
				}
				if level == 5 {
					return []byte{0x32, 6, 0, 1, 'x', 0, 7, 0}
				}
				return []byte{0x32, 5, 0, 1, 'x', 0, 7}
			}},
			acked: true,
		},
		{
			name:     "unexpected SUBACK",
			versions: []MQTTProtocol{Protocol311, Protocol5},
			opts:     afterBadConnack(bad, []byte{0x90, 3, 0, 1, 0}),
			lastErr:  "unexpected SUBACK",
		},
		{
			name:     "unexpected CONNACK",
			versions: []MQTTProtocol{Protocol311, Protocol5},
			opts:     afterBadConnack(bad, []byte{0x20, 2, 0, 0}),
			lastErr:  "unexpected CONNACK",
		},
		{
			name:     "unexpected UNSUBACK",
			versions: []MQTTProtocol{Protocol311, Protocol5},
			opts:     afterBadConnack(bad, []byte{0xB0, 2, 0, 1}),
			lastErr:  "unexpected UNSUBACK",
		},
		{
			name:     "huge declared length",
			versions: []MQTTProtocol{Protocol311, Protocol5},
			opts:     afterBadConnack(bad, []byte{0x32, 0xFF, 0xFF, 0xFF, 0x7F}),
			lastErr:  "over the 16384 bytes this client accepts",
		},
		{
			name:     "Session Present after a clean start",
			versions: []MQTTProtocol{Protocol311, Protocol5},
			opts: harness.FakeBrokerOptions{Connack: func(n int, level byte) []byte {
				switch {
				case !bad(n):
					return nil
				case level == 5:
					return []byte{0x20, 3, 1, 0, 0}
				}
				return []byte{0x20, 2, 1, 0}
			}},
			lastErr: "Session Present",
		},
		{
			name:     "Receive Maximum 0",
			versions: []MQTTProtocol{Protocol5},
			opts: harness.FakeBrokerOptions{Connack: func(n int, _ byte) []byte {
				if bad(n) {
					return []byte{0x20, 6, 0, 0, 3, 0x21, 0, 0}
				}
				return nil
			}},
			lastErr: "Receive Maximum of 0",
		},
		{
			name:     "no PINGRESP",
			versions: []MQTTProtocol{Protocol311, Protocol5},
			opts:     harness.FakeBrokerOptions{NoPingresp: bad},
			lastErr:  "no PINGRESP within the ping timeout",
			from:     1, // the PUBACKs come
		},
	}
	for _, c := range cases {
		for _, proto := range c.versions {
			t.Run(c.name+"/mqtt "+proto.String(), func(t *testing.T) {
				from := c.from
				if from == 0 {
					from = 3
				}
				testMisbehavingBroker(t, proto, c.opts, c.lastErr, c.acked, from)
			})
		}
	}
}

// afterBadConnack sends raw after the CONNACK on the connections bad says.
func afterBadConnack(bad func(int) bool, raw []byte) harness.FakeBrokerOptions {
	return harness.FakeBrokerOptions{AfterConnack: func(n int, _ byte) []byte {
		if bad(n) {
			return raw
		}
		return nil
	}}
}

func testMisbehavingBroker(t *testing.T, proto MQTTProtocol, opts harness.FakeBrokerOptions, lastErr string, acked bool, from int) {
	fb := harness.StartFakeBroker(t, opts)
	logs := new(harness.LogBuffer)
	ob := openTest(t, Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	const n = 20
	for i := range n {
		commitOrder(t, ob, "pos/orders", i)
	}
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: fb.URL(), ClientID: "misbehave", ConnectTimeout: 2 * time.Second,
		WriteTimeout: time.Second, KeepAlive: 300 * time.Millisecond, PingTimeout: 200 * time.Millisecond,
		Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	r, err := ob.NewRelay(pub, fastRelay())
	require.NoError(t, err)
	startRelay(t, r)
	t.Cleanup(func() {
		if t.Failed() {
			st, _ := r.Stats(context.Background())
			t.Logf("%d sent, %d dead, %d pending of %d; %d connections; LastError %q", countState(t, ob, "sent"),
				countState(t, ob, "dead"), countState(t, ob, "pending"), n, len(fb.Connects()), st.LastError)
		}
	})

	var committed []string
	rows, err := ob.DB().Query(`SELECT id FROM outbox ORDER BY seq`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		committed = append(committed, id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, committed, n)

	// The connections from the first that takes events see every event
	// once, in commit order.
	delivered := func() []string {
		var ids []string
		for _, p := range fb.Received() {
			if p.Conn >= from {
				ev, err := DecodeEvent(p.Payload)
				require.NoError(t, err)
				ids = append(ids, ev.ID)
			}
		}
		return ids
	}
	eventually(t, 10*time.Second, "every event settled and the broker past its bad connections", func() bool {
		return countState(t, ob, "sent")+countState(t, ob, "dead") == n && (acked || len(fb.Connects()) > 2)
	})
	require.Zero(t, countState(t, ob, "dead"), "events parked dead, of %d", n)
	st, err := r.Stats(context.Background())
	require.NoError(t, err)
	if acked {
		// The broker's PUBLISH was acknowledged on each bad connection,
		// and the first connection carried every event.
		require.Equal(t, []uint16{7}, fb.Acks())
		require.Len(t, fb.Connects(), 1, "no reconnection: LastError %q", st.LastError)
		var ids []string
		for _, p := range fb.Received() {
			ev, err := DecodeEvent(p.Payload)
			require.NoError(t, err)
			ids = append(ids, ev.ID)
		}
		require.Equal(t, committed, ids)
		return
	}
	got := delivered()
	require.Equal(t, committed, got, "the events the behaving broker received (%d of %d)", len(got), n)
	require.Contains(t, st.LastError, lastErr)
	require.True(t, slices.ContainsFunc(strings.Split(logs.String(), "\n"), func(l string) bool {
		return strings.Contains(l, "level=WARN") && strings.Contains(l, lastErr)
	}), "a warning says %q:\n%s", lastErr, logs.String())
}
