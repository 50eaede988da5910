//go:build linux

package outbox

import (
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestCommandReceiverIdleBytes measures what the receiver's connection
// costs while no command comes (docs/commands.md, "The second
// connection"): the segments and bytes the kernel counted on its socket
// (TCP_INFO, read on the proxy's side of it, which sees the same
// segments), over OUTBOX_MEASURE_IDLE (e.g. 5m) at the default KeepAlive,
// after the subscription, with the connection's setup counted apart. A
// measurement, not a check: run it by hand.
func TestCommandReceiverIdleBytes(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("OUTBOX_MEASURE_IDLE"))
	if err != nil {
		t.Skip("a measurement: OUTBOX_MEASURE_IDLE=5m go test -run TestCommandReceiverIdleBytes -v .")
	}
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan *net.TCPConn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", m.Addr())
		if err != nil {
			c.Close()
			return
		}
		// The proxy's own TCP keep-alive probes would be counted as the
		// broker's: Mosquitto sends none.
		c.(*net.TCPConn).SetKeepAlive(false)
		accepted <- c.(*net.TCPConn)
		go func() { io.Copy(up, c); up.Close() }()
		io.Copy(c, up)
		c.Close()
	}()
	ob := openTest(t, Options{})
	r, err := ob.NewMQTTCommandReceiver(MQTTCommandOptions{Broker: "tcp://" + ln.Addr().String(), ClientID: "till-idle-commands",
		Topics: []string{"tills/idle/commands"}, Protocol: Protocol5, Logger: testLogger()})
	require.NoError(t, err)
	defer harness.RunInBackground(t, "receiver", r)()
	c := <-accepted
	eventually(t, 10*time.Second, "subscribed", func() bool { return r.Stats().Connected })
	info := func() *unix.TCPInfo {
		raw, err := c.SyscallConn()
		require.NoError(t, err)
		var ti *unix.TCPInfo
		require.NoError(t, raw.Control(func(fd uintptr) { ti, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }))
		require.NoError(t, err)
		return ti
	}
	time.Sleep(time.Second) // the SUBACK's segments settle: a measurement's pause, not a synchronisation
	setup := info()
	time.Sleep(d)
	end := info()
	// On the proxy's socket, "in" is what the receiver sent, "out" what it
	// received. A segment's IPv4 and TCP headers with timestamps: 52 bytes.
	segs := int64(end.Segs_in-setup.Segs_in) + int64(end.Segs_out-setup.Segs_out)
	payload := int64(end.Bytes_received-setup.Bytes_received) + int64(end.Bytes_acked-setup.Bytes_acked)
	wire := payload + 52*segs
	perDay := float64(wire) * float64(24*time.Hour) / float64(d)
	t.Logf("setup (CONNECT to SUBACK): %d segments, %d bytes of MQTT, %d bytes with headers",
		setup.Segs_in+setup.Segs_out, setup.Bytes_received+setup.Bytes_acked, int64(setup.Bytes_received+setup.Bytes_acked)+52*int64(setup.Segs_in+setup.Segs_out))
	t.Logf("idle for %s: %d segments (%d to the broker, %d from it), %d bytes of MQTT, %d bytes with headers; a day: %.0f bytes (%.0f KiB), %.0f segments",
		d, segs, end.Segs_in-setup.Segs_in, end.Segs_out-setup.Segs_out, payload, wire, perDay, perDay/1024, float64(segs)*float64(24*time.Hour)/float64(d))
}
