package harness

import (
	"net"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// held lets every client in, after the test releases it.
type held struct {
	mochi.HookBase
	entered chan struct{}
	release chan struct{}
}

func (h *held) ID() string { return "held" }
func (h *held) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck
}
func (h *held) OnACLCheck(*mochi.Client, string, bool) bool { return true }
func (h *held) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool {
	h.entered <- struct{}{}
	<-h.release
	return true
}

// TestMochiStopWithAClientConnecting: a client whose CONNECT the broker is
// still handling when Stop begins is not among the clients mochi's Close
// disconnects; it then reads forever and Close waits for it forever (a
// relay reconnecting at once after a Stop hung outboxctl's tests in CI).
// Stop ends it too.
func TestMochiStopWithAClientConnecting(t *testing.T) {
	h := &held{entered: make(chan struct{}, 1), release: make(chan struct{})}
	m, err := LaunchMochi(MochiOptions{Hooks: []mochi.Hook{h}})
	require.NoError(t, err)
	c, err := net.Dial("tcp", m.Addr())
	require.NoError(t, err)
	defer c.Close()
	// CONNECT, MQTT 3.1.1, clean session, no keep-alive (no deadline on
	// the broker's side), client id "x".
	_, err = c.Write([]byte{0x10, 13, 0, 4, 'M', 'Q', 'T', 'T', 4, 2, 0, 0, 0, 1, 'x'})
	require.NoError(t, err)
	<-h.entered

	stopped := make(chan struct{})
	go func() { m.Stop(); close(stopped) }()
	// Once new connections are refused, Close has disconnected the
	// clients it knew of; this one comes in after.
	Eventually(t, 5*time.Second, "the listener closed", func() bool {
		d, err := net.DialTimeout("tcp", m.Addr(), time.Second)
		if err == nil {
			d.Close()
		}
		return err != nil
	})
	close(h.release)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		c.Close() // lets mochi's Close end, so the test ends
		<-stopped
		t.Fatal("Stop waited for a client that connected while it stopped")
	}
}
