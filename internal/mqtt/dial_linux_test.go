package mqtt

import (
	"context"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDialNoTCPKeepAlive: a connection to a broker sends no TCP keep-alive
// probes (SO_KEEPALIVE off): MQTT's keep-alive is the one that runs.
func TestDialNoTCPKeepAlive(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			c.Read(make([]byte, 1))
		}
	}()
	conn, err := dialer{timeout: 5 * time.Second}.dial(context.Background(), &url.URL{Scheme: "mqtt", Host: ln.Addr().String()})
	require.NoError(t, err)
	defer conn.Close()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var on int
	var serr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		on, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
	}))
	require.NoError(t, serr)
	require.Zero(t, on, "SO_KEEPALIVE")
}
