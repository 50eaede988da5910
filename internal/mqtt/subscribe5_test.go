package mqtt

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// TestFirstBytesClassify: a failed MQTT 5 connect says what the version
// choice needs, from paho's CONNACK or from the first bytes read when paho
// could not decode them (a 3.1.1 broker's CONNACK).
func TestFirstBytesClassify(t *testing.T) {
	other := errors.New("i/o timeout")
	for _, c := range []struct {
		head  []byte
		ca    *paho.Connack
		err   error
		is    error  // what the result must match
		words string // what it must say
	}{
		{head: []byte{0x20, 2, 0, 1}, err: other, is: ErrUnsupportedVersion, words: "unacceptable protocol version (1)"},
		{head: []byte{0x20, 2, 0, 5}, err: other, words: "CONNACK not authorised (5)"},
		{ca: &paho.Connack{ReasonCode: 0x84}, err: other, is: ErrUnsupportedVersion, words: "unsupported protocol version (0x84)"},
		{ca: &paho.Connack{ReasonCode: 0x87, Properties: &paho.ConnackProperties{ReasonString: "no"}}, err: other,
			words: "CONNACK not authorized (0x87): no"},
		{err: io.EOF, is: ErrClosedAfterConnect},
		{err: syscall.ECONNRESET, is: ErrClosedAfterConnect},
		{head: []byte{0x20}, err: io.EOF, is: io.EOF}, // something came: not a bare close
		{err: other, is: other},
	} {
		fb := &firstBytes{head: c.head}
		got := fb.classify(c.ca, c.err)
		if c.is != nil {
			require.ErrorIs(t, got, c.is, "%x %v", c.head, c.err)
		}
		if c.is != ErrClosedAfterConnect {
			require.NotErrorIs(t, got, ErrClosedAfterConnect, "%x %v", c.head, c.err)
		}
		if c.words != "" {
			require.ErrorContains(t, got, c.words)
		}
	}
}

// TestPinger5AnyPacketCounts: the subscriber's pinger takes any packet
// after its PINGREQ as a sign of life, not only the PINGRESP, and gives the
// connection up when nothing at all comes within the timeout.
func TestPinger5AnyPacketCounts(t *testing.T) {
	client, broker := net.Pipe()
	defer broker.Close()
	p := &pinger5{timeout: 300 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background(), client, 1) }()
	buf := make([]byte, 2)
	broker.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.ReadFull(broker, buf)
	require.NoError(t, err)
	require.Equal(t, pingreq, buf)
	p.PacketReceived() // a PUBLISH, say; no PINGRESP
	// The next PINGREQ comes a keepalive later: the connection lived on.
	_, err = io.ReadFull(broker, buf)
	require.NoError(t, err)
	require.Equal(t, pingreq, buf)
	select {
	case err := <-done:
		require.ErrorContains(t, err, "nothing from the broker within 300ms of a PINGREQ")
	case <-time.After(5 * time.Second):
		t.Fatal("a silent broker was not given up")
	}
}
