package mqtt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// openFake opens a publish connection to a fake broker, speaking 5 (v5) or
// 3.1.1; the connection is closed and its goroutines awaited when the test
// ends.
func openFake(t *testing.T, b *harness.FakeBroker, v5 bool, tweak func(*Options)) (*Conn, error) {
	t.Helper()
	u, err := url.Parse(b.URL())
	require.NoError(t, err)
	var wg sync.WaitGroup
	o := &Options{ClientID: "misbehave", ConnectTimeout: 2 * time.Second, WriteTimeout: time.Second,
		PingTimeout: time.Second, Logger: slog.New(slog.DiscardHandler), Goroutines: &wg}
	if tweak != nil {
		tweak(o)
	}
	c, err := Open(context.Background(), &Attempt{URL: u, V5: v5}, o)
	t.Cleanup(func() {
		if c != nil {
			c.Close()
		}
		wg.Wait()
	})
	return c, err
}

// await waits for tok and returns its error.
func await(t *testing.T, tok Token) error {
	t.Helper()
	select {
	case <-tok.Done():
		return tok.Error()
	case <-time.After(5 * time.Second):
		t.Fatal("token not completed")
		return nil
	}
}

// lostTo waits for c to be lost and returns why (LostReason).
func lostTo(t *testing.T, c *Conn) error {
	t.Helper()
	select {
	case <-c.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the connection was not lost")
	}
	return c.LostReason()
}

// puback is a PUBACK for id: MQTT 3.1.1's (or MQTT 5's success) with no
// code, else with these bytes after the packet id.
func puback(id uint16, rest ...byte) []byte {
	return append([]byte{0x40, byte(2 + len(rest)), byte(id >> 8), byte(id)}, rest...)
}

func versionName(v5 bool) string {
	if v5 {
		return "mqtt 5"
	}
	return "mqtt 3.1.1"
}

// TestMisbehavingBrokerAfterConnect: a broker that sends what the
// publisher does not expect, or malformed, once connected, on both
// versions. A packet that breaks the version's rules closes the connection
// with a ProtocolError, which the publish in flight fails with (wrapped in
// ErrDisconnected: the connection's fault) and LostReason reports; it is
// never a PubackError, the message's fault. What each version allows is
// taken as it says.
func TestMisbehavingBrokerAfterConnect(t *testing.T) {
	type want int
	const (
		delivered   want = iota // the publish succeeds, the connection stays
		refused                 // a PubackError 0x87
		protocolErr             // the connection is closed with a ProtocolError
	)
	cases := []struct {
		name   string
		opts   func(v5 bool) harness.FakeBrokerOptions
		want   func(v5 bool) want
		acks   []uint16 // the PUBACKs the publisher must send the broker
		detail string   // in the ProtocolError's text
	}{
		{
			name: "3-byte PUBACK 0x87",
			opts: func(bool) harness.FakeBrokerOptions {
				return harness.FakeBrokerOptions{Answer: func(_ int, p harness.FakePublish) harness.FakeAnswer {
					return harness.FakeAnswer{Raw: puback(p.ID, 0x87)}
				}}
			},
			// MQTT 5: a refusal; 3.1.1 has no reason code, so the PUBACK is
			// malformed.
			want: func(v5 bool) want {
				if v5 {
					return refused
				}
				return protocolErr
			},
			detail: "3 bytes",
		},
		{
			name: "QoS 1 PUBLISH to the publisher",
			opts: func(bool) harness.FakeBrokerOptions {
				return harness.FakeBrokerOptions{AfterConnack: func(_ int, level byte) []byte {
					if level == 5 {
						return []byte{0x32, 6, 0, 1, 'x', 0, 7, 0} // topic "x", id 7, no properties
					}
					return []byte{0x32, 5, 0, 1, 'x', 0, 7}
				}}
			},
			want: func(bool) want { return delivered },
			acks: []uint16{7},
		},
		{
			name: "QoS 0 PUBLISH to the publisher",
			opts: func(bool) harness.FakeBrokerOptions {
				return harness.FakeBrokerOptions{AfterConnack: func(_ int, level byte) []byte {
					if level == 5 {
						return []byte{0x30, 5, 0, 1, 'x', 0, 'p'}
					}
					return []byte{0x30, 4, 0, 1, 'x', 'p'}
				}}
			},
			want: func(bool) want { return delivered },
		},
		{
			name:   "unexpected SUBACK",
			opts:   after([]byte{0x90, 3, 0, 1, 0}),
			want:   func(bool) want { return protocolErr },
			detail: "unexpected SUBACK",
		},
		{
			name:   "unexpected CONNACK",
			opts:   after([]byte{0x20, 2, 0, 0}),
			want:   func(bool) want { return protocolErr },
			detail: "unexpected CONNACK",
		},
		{
			name:   "unexpected UNSUBACK",
			opts:   after([]byte{0xB0, 2, 0, 1}),
			want:   func(bool) want { return protocolErr },
			detail: "unexpected UNSUBACK",
		},
		{
			name:   "unknown PUBACK",
			opts:   after(puback(999)),
			want:   func(bool) want { return protocolErr },
			detail: "packet id 999",
		},
		{
			name: "duplicate PUBACK",
			opts: func(bool) harness.FakeBrokerOptions {
				return harness.FakeBrokerOptions{Answer: func(_ int, p harness.FakePublish) harness.FakeAnswer {
					return harness.FakeAnswer{Raw: append(puback(p.ID), puback(p.ID)...)}
				}}
			},
			want:   func(bool) want { return protocolErr },
			detail: "no publish in flight",
		},
		{
			name:   "malformed Remaining Length",
			opts:   after([]byte{0x40, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}),
			want:   func(bool) want { return protocolErr },
			detail: "Remaining Length",
		},
		{
			name: "trickled PUBACK with a reason string",
			opts: func(bool) harness.FakeBrokerOptions {
				return harness.FakeBrokerOptions{Answer: func(_ int, p harness.FakePublish) harness.FakeAnswer {
					raw := puback(p.ID)
					if p.Level == 5 {
						raw = puback(p.ID, 0x00, 6, 0x1F, 0, 3, 'y', 'e', 's')
					}
					return harness.FakeAnswer{Raw: raw, Trickle: 5 * time.Millisecond}
				}}
			},
			want: func(bool) want { return delivered },
		},
	}
	for _, c := range cases {
		for _, v5 := range []bool{true, false} {
			t.Run(c.name+"/"+versionName(v5), func(t *testing.T) {
				b := harness.StartFakeBroker(t, c.opts(v5))
				conn, err := openFake(t, b, v5, nil)
				require.NoError(t, err)
				err = await(t, conn.Publish("a/b", []byte("hello"), nil))
				var pe *ProtocolError
				var re *PubackError
				switch c.want(v5) {
				case delivered:
					require.NoError(t, err)
					harness.Eventually(t, 5*time.Second, "the broker's PUBLISH acknowledged", func() bool {
						return fmt.Sprint(b.Acks()) == fmt.Sprint(c.acks)
					})
					select {
					case <-conn.Lost():
						t.Fatalf("the connection was lost: %v", conn.LostReason())
					default:
					}
				case refused:
					require.ErrorAs(t, err, &re)
					require.EqualValues(t, 0x87, re.Code)
				case protocolErr:
					reason := lostTo(t, conn)
					require.ErrorAs(t, reason, &pe, "LostReason: %v", reason)
					require.Contains(t, reason.Error(), c.detail)
					// The publish may have been acknowledged before the
					// fault, or handed over after it.
					if err != nil && !errors.Is(err, ErrNotConnected) {
						require.ErrorIs(t, err, ErrDisconnected)
						require.ErrorAs(t, err, &pe)
						require.False(t, errors.As(err, &re), "never the message's fault: %v", err)
					}
				}
			})
		}
	}
}

// after is a script that sends raw right after the CONNACK.
func after(raw []byte) func(bool) harness.FakeBrokerOptions {
	return func(bool) harness.FakeBrokerOptions {
		return harness.FakeBrokerOptions{AfterConnack: func(int, byte) []byte { return raw }}
	}
}

// TestMisbehavingConnack: a CONNACK that breaks the rules fails the
// connection attempt with a ProtocolError: a session present after a clean
// start, on both versions; on MQTT 5 a Receive Maximum or a Maximum Packet
// Size of 0, and a CONNACK that is malformed.
func TestMisbehavingConnack(t *testing.T) {
	cases := []struct {
		name    string
		v5      bool
		connack []byte
		detail  string
	}{
		{"session present/mqtt 5", true, []byte{0x20, 3, 1, 0, 0}, "Session Present"},
		{"session present/mqtt 3.1.1", false, []byte{0x20, 2, 1, 0}, "Session Present"},
		{"receive maximum 0/mqtt 5", true, []byte{0x20, 6, 0, 0, 3, 0x21, 0, 0}, "Receive Maximum of 0"},
		{"maximum packet size 0/mqtt 5", true, []byte{0x20, 8, 0, 0, 5, 0x27, 0, 0, 0, 0}, "Maximum Packet Size of 0"},
		{"a PUBACK for a CONNACK/mqtt 3.1.1", false, []byte{0x40, 2, 0, 1}, "with a PUBACK"},
		{"a CONNACK of 3 bytes/mqtt 3.1.1", false, []byte{0x20, 3, 0, 0, 0}, "malformed CONNACK"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := harness.StartFakeBroker(t, harness.FakeBrokerOptions{Connack: func(int, byte) []byte { return c.connack }})
			_, err := openFake(t, b, c.v5, nil)
			var pe *ProtocolError
			require.ErrorAs(t, err, &pe, "%v", err)
			require.Contains(t, err.Error(), c.detail)
		})
	}
}

// TestHugeDeclaredLength: a packet that declares MQTT's largest Remaining
// Length (256 MiB), after the CONNACK or as the CONNACK, closes the
// connection with a ProtocolError at once, without allocating it: the
// process allocates less than 4 MiB meanwhile.
func TestHugeDeclaredLength(t *testing.T) {
	huge := []byte{0xFF, 0xFF, 0xFF, 0x7F}
	for _, v5 := range []bool{true, false} {
		for _, where := range []string{"PUBLISH after the CONNACK", "CONNACK"} {
			t.Run(where+"/"+versionName(v5), func(t *testing.T) {
				var opts harness.FakeBrokerOptions
				if where == "CONNACK" {
					opts.Connack = func(int, byte) []byte { return append([]byte{0x20}, huge...) }
				} else {
					opts.AfterConnack = func(int, byte) []byte { return append([]byte{0x32}, huge...) }
				}
				b := harness.StartFakeBroker(t, opts)
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				conn, err := openFake(t, b, v5, nil)
				if where != "CONNACK" {
					require.NoError(t, err)
					err = lostTo(t, conn)
				}
				runtime.ReadMemStats(&after)
				var pe *ProtocolError
				require.ErrorAs(t, err, &pe, "%v", err)
				require.Contains(t, err.Error(), "268435460 bytes, over the 16384")
				grew := after.TotalAlloc - before.TotalAlloc
				require.Less(t, grew, uint64(4<<20), "allocated %d bytes", grew)
			})
		}
	}
}

// TestAnnouncesMaximumPacketSize: the MQTT 5 CONNECT announces the largest
// packet the publisher accepts.
func TestAnnouncesMaximumPacketSize(t *testing.T) {
	b := harness.StartFakeBroker(t, harness.FakeBrokerOptions{})
	_, err := openFake(t, b, true, nil)
	require.NoError(t, err)
	require.EqualValues(t, MaxInboundPacket, b.Connects()[0].MaxPacket)
}

// TestPingTimeoutSaysWhy: a broker that stops answering PINGREQs ends the
// connection, and LostReason says it was the ping timeout.
func TestPingTimeoutSaysWhy(t *testing.T) {
	for _, v5 := range []bool{true, false} {
		t.Run(versionName(v5), func(t *testing.T) {
			b := harness.StartFakeBroker(t, harness.FakeBrokerOptions{NoPingresp: func(int) bool { return true }})
			conn, err := openFake(t, b, v5, func(o *Options) {
				o.KeepAlive, o.PingTimeout = 300*time.Millisecond, 200*time.Millisecond
			})
			require.NoError(t, err)
			reason := lostTo(t, conn)
			require.ErrorIs(t, reason, ErrPingTimeout)
			require.ErrorContains(t, reason, "200ms")
		})
	}
}

// TestBrokerStopsReading: a broker that stops reading backs up the
// publisher's writes until the write timeout gives up the connection: the
// publishes fail as the connection's fault (a stall or a disconnection),
// never as a refusal.
func TestBrokerStopsReading(t *testing.T) {
	for _, v5 := range []bool{true, false} {
		t.Run(versionName(v5), func(t *testing.T) {
			b := harness.StartFakeBroker(t, harness.FakeBrokerOptions{Answer: func(int, harness.FakePublish) harness.FakeAnswer {
				return harness.FakeAnswer{Silent: true, StopReading: true}
			}})
			conn, err := openFake(t, b, v5, func(o *Options) { o.WriteTimeout = 200 * time.Millisecond })
			require.NoError(t, err)
			payload := make([]byte, 64<<10)
			var toks []Token
			for range 400 { // 25 MiB: more than loopback's buffers hold
				toks = append(toks, conn.Publish("a/b", payload, nil))
			}
			for _, tok := range toks {
				err := await(t, tok)
				require.Error(t, err)
				var re *PubackError
				require.False(t, errors.As(err, &re), "%v", err)
				var se *StallError
				require.True(t, errors.As(err, &se) || errors.Is(err, ErrDisconnected) || errors.Is(err, ErrNotConnected), "%v", err)
			}
		})
	}
}

// TestPacketIDWrapAround: more than 65,535 publishes on one connection, at
// most a window of them in flight: each is acknowledged, and the packet ids
// wrap from 65,535 to 1, never 0.
func TestPacketIDWrapAround(t *testing.T) {
	for _, v5 := range []bool{true, false} {
		t.Run(versionName(v5), func(t *testing.T) {
			b := harness.StartFakeBroker(t, harness.FakeBrokerOptions{})
			conn, err := openFake(t, b, v5, nil)
			require.NoError(t, err)
			const n, window = 65_600, 1024
			toks := make(chan Token, window)
			go func() {
				defer close(toks)
				for range n {
					toks <- conn.Publish("a", nil, nil)
				}
			}()
			done := 0
			for tok := range toks {
				require.NoError(t, await(t, tok), "publish %d", done+1)
				done++
			}
			require.Equal(t, n, done)
			got := b.Received()
			require.Len(t, got, n)
			for i, p := range got {
				require.EqualValues(t, i%65535+1, p.ID, "publish %d", i+1)
			}
		})
	}
}

// TestAllocateSkipsIDsInUse: the packet id after 65,535 is 1, and an id
// still awaiting its PUBACK is skipped.
func TestAllocateSkipsIDsInUse(t *testing.T) {
	c := &Conn{pending: map[uint16]*PublishToken{1: nil, 3: nil}, nextID: 65534}
	require.EqualValues(t, 65535, c.allocate())
	require.EqualValues(t, 2, c.allocate())
	require.EqualValues(t, 4, c.allocate())
}
