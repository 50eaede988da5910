package outbox

import (
	"context"
	"database/sql"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// The slow-link tests are the case scaled down for CI: a 256 KiB
// message alone on a 40 kbit/s uplink (52 s, with a 30 s AckTimeout) becomes
// a 32 KiB JSON payload at 20 or 40 kbit/s with a 2 s AckTimeout. The
// publisher's timeouts are scaled with it: WriteTimeout and PingTimeout 1 s,
// KeepAlive 12 s. KeepAlive cannot be scaled further: mochi, like the MQTT
// specification, closes a connection on which no whole packet arrived within
// 1.5 × KeepAlive, and the message takes about 13.4 s at 20 kbit/s — longer
// when the machine is loaded and the shaping proxy falls behind: with 10 s
// (15 s) the four runs in parallel (two send buffers, two MQTT versions) were
// cut by mochi now and then in a full `go test ./...`. The keepalive ping, at
// 12 s, still goes out during the transfer.
//
// Each runs twice: with the kernel's own send buffer, which on loopback
// takes the whole message at once (bytes "written" long before they have
// left), and with a 4 KiB one, in which writes block for as long as the
// link takes (paho's per-packet write deadline).

// slowLinkSendBuffers are the two ways a device's socket may hold the bytes.
var slowLinkSendBuffers = []struct {
	name   string
	sndbuf int // 0: the kernel's default
}{
	{"kernel send buffer", 0},
	{"4 KiB send buffer", 4 << 10},
}

type slowLinkCase struct {
	name   string
	sndbuf int
	proto  MQTTProtocol
}

// slowLinkCases is each send buffer on each MQTT version.
func slowLinkCases() []slowLinkCase {
	var cases []slowLinkCase
	for _, b := range slowLinkSendBuffers {
		for _, proto := range testProtocols {
			cases = append(cases, slowLinkCase{b.name + ", mqtt " + proto.String(), b.sndbuf, proto})
		}
	}
	return cases
}

// slowLinkPublisher returns a publisher with the scaled-down timeouts and,
// if sndbuf > 0, a socket send buffer that small.
func slowLinkPublisher(t *testing.T, brokerURL string, sndbuf int, proto MQTTProtocol) *MQTTPublisher {
	t.Helper()
	pub, err := NewMQTTPublisher(MQTTOptions{
		Broker: brokerURL, ClientID: "slow-" + NewID()[24:],
		ConnectTimeout: 2 * time.Second, WriteTimeout: time.Second,
		KeepAlive: 12 * time.Second, PingTimeout: time.Second,
		Protocol: proto, Logger: testLogger(),
	})
	require.NoError(t, err)
	if sndbuf > 0 {
		pub.control = func(_, _ string, c syscall.RawConn) error {
			var err error
			if cerr := c.Control(func(fd uintptr) {
				err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, sndbuf)
			}); cerr != nil {
				return cerr
			}
			return err
		}
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// commitBlob commits a business row and an event with a JSON payload of
// about n bytes.
func commitBlob(t *testing.T, ob *Outbox, topic string, n int) {
	t.Helper()
	payload := []byte(`{"blob":"` + strings.Repeat("0123456789abcdef", n/16) + `"}`)
	err := ob.Transact(context.Background(), func(tx *sql.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (item) VALUES ('blob')`); err != nil {
			return err
		}
		return ob.Enqueue(context.Background(), tx, Message{Topic: topic, Payload: payload})
	})
	require.NoError(t, err)
}

// reportOnFailure logs, if the test failed, what became of the messages and
// how many connections the proxy carried.
func reportOnFailure(t *testing.T, ob *Outbox, p *harness.FaultProxy) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		rows, err := ob.DB().Query(`SELECT seq, state, attempts, coalesce(last_error, '') FROM outbox_messages ORDER BY seq`)
		if err != nil {
			t.Logf("cannot read the outbox: %v", err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			var seq int64
			var state, lastErr string
			var attempts int
			if err := rows.Scan(&seq, &state, &attempts, &lastErr); err == nil {
				t.Logf("seq %d: %s, %d attempts charged, last error %q", seq, state, attempts, lastErr)
			}
		}
		t.Logf("proxy: %d connections, %d bytes up, %d down", p.Connected(), p.Moved(harness.ToBroker), p.Moved(harness.ToClient))
	})
}

// startSlowLink starts a broker behind a link of rate bytes per second each
// way, and a relay with opts over it whose first message is a 32 KiB blob.
func startSlowLink(t *testing.T, tc slowLinkCase, rate int64, opts RelayOptions) (*broker, *harness.FaultProxy, *Outbox, *Relay) {
	b := startBroker(t)
	p := harness.StartShapedProxy(t, b.addr, rate, rate)
	ob := openTest(t, Options{})
	r, err := ob.NewRelay(slowLinkPublisher(t, p.URL(), tc.sndbuf, tc.proto), opts)
	require.NoError(t, err)
	reportOnFailure(t, ob, p)
	commitBlob(t, ob, "pos/blobs", 32<<10)
	return b, p, ob, r
}

// TestSlowLinkChargesNothing: a message whose bytes take six AckTimeouts to
// cross the uplink, and two small ones behind it, are delivered on the first
// connection with nothing charged. The ack clock of a message starts when
// its bytes have left, not when it was handed to the connection.
func TestSlowLinkChargesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("a slow link: about 15 s")
	}
	for _, tc := range slowLinkCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const rate = 2500 // bytes per second each way: 20 kbit/s
			opts := fastRelay()
			b, p, ob, r := startSlowLink(t, tc, rate, opts)
			commitOrder(t, ob, "pos/orders", 2)
			commitOrder(t, ob, "pos/orders", 3)

			start := time.Now()
			startRelay(t, r)
			eventually(t, 35*time.Second, "the three messages settled", func() bool {
				return countState(t, ob, "sent")+countState(t, ob, "dead") == 3
			})
			took := time.Since(start)
			for seq := int64(1); seq <= 3; seq++ {
				state, attempts := rowState(t, ob, seq)
				require.Equal(t, "sent", state, "seq %d", seq)
				require.Zero(t, attempts, "seq %d: a slow link counted against the message", seq)
			}
			require.EqualValues(t, 1, p.Connected(), "a connection that was moving the bytes was deemed broken")
			require.Greater(t, took, 4*opts.AckTimeout, "the link was not slow: the test proves nothing")
			checkOrdered(t, b.rec, 3)
			t.Logf("%d bytes up in %s at %d B/s (AckTimeout %s): one connection, 0 attempts charged",
				p.Moved(harness.ToBroker), took.Round(100*time.Millisecond), rate, opts.AckTimeout)
		})
	}
}

// TestSlowLinkStallIsAnOutage: a link that stops moving bytes altogether
// while a big message crosses it is still deemed broken within about
// AckTimeout — a stall stays an outage — and charges nothing, even when the
// message is the suspect sent alone, since its bytes never got out.
func TestSlowLinkStallIsAnOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a slow link: about 20 s")
	}
	for _, tc := range slowLinkCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const rate = 5000 // bytes per second each way: 40 kbit/s
			opts := fastRelay()
			_, p, ob, r := startSlowLink(t, tc, rate, opts)
			startRelay(t, r)

			// Cut mid-message: on the next connection it is the suspect,
			// sent alone, and a lost connection would charge it.
			eventually(t, 10*time.Second, "8 KiB of the message forwarded", func() bool { return p.Moved(harness.ToBroker) >= 8<<10 })
			p.Cut(false)
			base := p.Moved(harness.ToBroker)
			eventually(t, 10*time.Second, "8 KiB more on the next connection", func() bool {
				return p.Connected() == 2 && p.Moved(harness.ToBroker) >= base+8<<10
			})

			stall := 3 * opts.AckTimeout
			ended := make(chan struct{})
			stallStart := time.Now()
			go func() { defer close(ended); p.StallFor(stall) }()
			eventually(t, opts.AckTimeout+2*time.Second, "the relay deems the stalled connection broken", func() bool {
				s, err := r.Stats(context.Background())
				require.NoError(t, err)
				return !s.Connected
			})
			noticed := time.Since(stallStart)
			select {
			case <-ended:
				t.Fatalf("the stall of %s ended before the relay gave up on it", stall)
			default:
			}
			<-ended

			eventually(t, 30*time.Second, "the message sent after the stall", func() bool { return countState(t, ob, "sent") == 1 })
			state, attempts := rowState(t, ob, 1)
			require.Equal(t, "sent", state)
			require.Zero(t, attempts, "a stall counted against a message whose bytes never got out")
			require.GreaterOrEqual(t, p.Connected(), int64(3))
			t.Logf("stall of %s noticed after %s (AckTimeout %s); %d connections, 0 attempts charged",
				stall, noticed.Round(10*time.Millisecond), opts.AckTimeout, p.Connected())
		})
	}
}
