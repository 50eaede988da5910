package mqtt

import (
	"context"
	"log/slog"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// runSession runs one subscriber session (Subscribe) against a fake
// broker until it ends or the deadline passes, handing each message to got
// and acknowledging it; it returns the session's error, and
// context.DeadlineExceeded if the session was still running. stop, if set,
// ends the session once it returns true for a message.
func runSession(t *testing.T, b *harness.FakeBroker, v5 bool, maxPacket int, stop func(Message) bool) error {
	t.Helper()
	u, err := url.Parse(b.URL())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o := &SessionOptions{ClientID: "bound", Topics: []string{"t"}, MaxPacketBytes: maxPacket,
		ConnectTimeout: 2 * time.Second, KeepAlive: 30 * time.Second, PingTimeout: time.Second,
		Logger: slog.New(slog.DiscardHandler)}
	var stopped bool
	err = Subscribe(ctx, &Attempt{URL: u, V5: v5}, o, func(_ context.Context, m Message) bool {
		m.Ack()
		if stop != nil && stop(m) {
			stopped = true
			return false
		}
		return true
	})
	if err == nil && !stopped {
		return context.DeadlineExceeded
	}
	return err
}

// sizedPublish is a QoS 1 PUBLISH to topic "t" (packet id 1, over 5 no
// properties) of exactly size bytes, its fixed header included.
func sizedPublish(v5 bool, size int) []byte {
	head := []byte{0, 1, 't', 0, 1}
	if v5 {
		head = append(head, 0)
	}
	for w := 1; w <= 4; w++ {
		if rem := size - 1 - w; varintSize(rem) == w {
			pkt := appendVarint([]byte{0x32}, rem)
			pkt = append(pkt, head...)
			return append(pkt, make([]byte, rem-len(head))...)
		}
	}
	panic("no PUBLISH of that size")
}

// TestSubscriberHugeDeclaredLength: a PUBLISH that declares MQTT's largest
// Remaining Length (256 MiB) ends the subscriber's session, on both
// versions, with a ProtocolError, before paho allocates it: the process
// allocates less than 4 MiB meanwhile. It comes once the subscriber
// subscribed, and over 3.1.1 also right after the CONNACK, as a resumed
// session's backlog does (paho.mqtt.golang's SUBSCRIBE must not then wait
// out its 30 s). Not over 5: paho.golang's Connect races, under -race, with
// a connection that ends before it returned.
func TestSubscriberHugeDeclaredLength(t *testing.T) {
	huge := []byte{0x32, 0xFF, 0xFF, 0xFF, 0x7F}
	for _, c := range []struct {
		v5    bool
		where string
	}{{true, "after the SUBSCRIBE"}, {false, "after the SUBSCRIBE"}, {false, "after the CONNACK"}} {
		t.Run(versionName(c.v5)+"/"+c.where, func(t *testing.T) {
			var opts harness.FakeBrokerOptions
			send := func(int, byte) []byte { return huge }
			if c.where == "after the CONNACK" {
				opts.AfterConnack = send
			} else {
				opts.AfterSubscribe = send
			}
			b := harness.StartFakeBroker(t, opts)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := runSession(t, b, c.v5, 0, nil)
			runtime.ReadMemStats(&after)
			var pe *ProtocolError
			require.ErrorAs(t, err, &pe, "%v", err)
			require.ErrorContains(t, err, "PUBLISH of 268435460 bytes, over the subscriber's limit of 17825792")
			grew := after.TotalAlloc - before.TotalAlloc
			require.Less(t, grew, uint64(4<<20), "allocated %d bytes", grew)
		})
	}
}

// TestSubscriberPacketLimit: a PUBLISH of exactly MaxPacketBytes, fixed
// header included, is delivered; one a byte larger ends the session with a
// ProtocolError, on both versions.
func TestSubscriberPacketLimit(t *testing.T) {
	const limit = 100_000 // a Remaining Length of 3 bytes
	for _, v5 := range []bool{true, false} {
		for _, size := range []int{limit, limit + 1} {
			t.Run(versionName(v5)+"/"+map[bool]string{true: "at the limit", false: "over it"}[size == limit], func(t *testing.T) {
				b := harness.StartFakeBroker(t, harness.FakeBrokerOptions{AfterSubscribe: func(int, byte) []byte {
					return sizedPublish(v5, size)
				}})
				var got []byte
				err := runSession(t, b, v5, limit, func(m Message) bool {
					got = m.Payload
					return true
				})
				if size == limit {
					require.NoError(t, err)
					header := 1 + 3 + 5
					if v5 {
						header++
					}
					require.Len(t, got, limit-header)
					return
				}
				var pe *ProtocolError
				require.ErrorAs(t, err, &pe, "%v", err)
				require.ErrorContains(t, err, "PUBLISH of 100001 bytes, over the subscriber's limit of 100000")
				require.Nil(t, got, "the PUBLISH was delivered")
			})
		}
	}
}

// TestSubscriberAnnouncesMaximumPacketSize: the MQTT 5 subscriber's
// CONNECT announces its limit as the Maximum Packet Size, so that a
// compliant broker drops a larger message for it instead of sending it.
func TestSubscriberAnnouncesMaximumPacketSize(t *testing.T) {
	for _, c := range []struct{ set, want int }{{0, DefaultMaxPacketBytes}, {100_000, 100_000}} {
		b := harness.StartFakeBroker(t, harness.FakeBrokerOptions{AfterSubscribe: func(int, byte) []byte {
			return sizedPublish(true, 100)
		}})
		require.NoError(t, runSession(t, b, true, c.set, func(Message) bool { return true }))
		require.EqualValues(t, c.want, b.Connects()[0].MaxPacket)
	}
}
