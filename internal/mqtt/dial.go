package mqtt

import (
	"context"
	"crypto/tls"
	"net"
	"net/url"
	"syscall"
	"time"

	netproxy "golang.org/x/net/proxy"
)

// dialer opens the network connection to a broker, for the publisher and
// for both of the subscriber's sessions alike: TCP, through the proxy that
// ALL_PROXY names if any (NO_PROXY honoured), then TLS for a TLS URL.
type dialer struct {
	// tls is the configuration for a TLS URL; nil means TLS 1.2 at least
	// and the system roots. Without a ServerName, the URL's host is
	// checked, as tls.Dial does.
	tls *tls.Config
	// timeout, if not 0, bounds the dial and the TLS handshake together.
	timeout time.Duration
	// control, if set, is given the socket before it connects (tests
	// shrink its send buffer with it).
	control func(network, address string, c syscall.RawConn) error
	// under, if set, wraps the socket before TLS goes on top of it: the
	// publisher counts the bytes that leave there (link).
	under func(net.Conn) net.Conn
}

// dial connects to the broker at u. A cancelled ctx ends the attempt at
// once.
func (d dialer) dial(ctx context.Context, u *url.URL) (net.Conn, error) {
	if d.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.timeout)
		defer cancel()
	}
	// No TCP keep-alive probes: MQTT's own keep-alive already tells a dead
	// connection, and Go's default probe after 15 s of silence added two
	// segments to every idle keep-alive period on a metered link.
	nd := &net.Dialer{Control: d.control, KeepAlive: -1}
	var raw net.Conn
	var err error
	if cd, ok := netproxy.FromEnvironmentUsing(nd).(netproxy.ContextDialer); ok {
		raw, err = cd.DialContext(ctx, "tcp", u.Host)
	} else {
		raw, err = nd.DialContext(ctx, "tcp", u.Host)
	}
	if err != nil {
		return nil, err
	}
	conn := raw
	if d.under != nil {
		conn = d.under(raw)
	}
	if !IsTLS(u) {
		return conn, nil
	}
	cfg := d.tls
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName = u.Hostname()
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return tc, nil
}

// Dial connects to the broker at u as the publisher and the subscriber do
// (the proxy ALL_PROXY names, then TLS with cfg for a TLS URL), within
// timeout: for a tool that brings its own MQTT client.
func Dial(ctx context.Context, u *url.URL, cfg *tls.Config, timeout time.Duration) (net.Conn, error) {
	return dialer{tls: cfg, timeout: timeout}.dial(ctx, u)
}
