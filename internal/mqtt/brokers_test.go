package mqtt

import (
	"context"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// client is the publisher's use of Brokers: one connection at a time, and
// the version it speaks.
type client struct {
	b    *Brokers
	o    Options
	wg   sync.WaitGroup
	conn *Conn
}

func newClient(t *testing.T, addr string) *client {
	u, err := ParseURL(addr)
	require.NoError(t, err)
	c := &client{b: NewBrokers([]*url.URL{u}, "fallback", slog.New(slog.DiscardHandler), "")}
	c.o = Options{ClientID: "fallback", ConnectTimeout: 2 * time.Second, WriteTimeout: time.Second, KeepAlive: 2 * time.Second,
		PingTimeout: time.Second, Logger: slog.New(slog.DiscardHandler), Goroutines: &c.wg}
	t.Cleanup(func() { c.close(); c.wg.Wait() })
	return c
}

func (c *client) connect(ctx context.Context) error {
	c.close()
	return c.b.Connect(ctx, Auto, func(ctx context.Context, a *Attempt) error {
		cn, err := Open(ctx, a, &c.o)
		c.conn = cn
		return err
	})
}

func (c *client) protocol() string {
	switch {
	case c.conn == nil:
		return ""
	case c.conn.V5():
		return "5"
	}
	return "3.1.1"
}

func (c *client) close() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// TestAutoFallsBackAfterTwoBareCloses: a close without a CONNACK right after
// the 5 CONNECT may be an outage: one is an ordinary failed connect, two in
// a row make auto speak 3.1.1, and it tries 5 again after retry5After.
func TestAutoFallsBackAfterTwoBareCloses(t *testing.T) {
	b := harness.StartMochi(t, harness.MochiOptions{})
	g := harness.StartVersionGate(t, b.Addr(), harness.GateClose)
	c := newClient(t, g.URL())
	ctx := context.Background()

	err := c.connect(ctx)
	require.ErrorIs(t, err, ErrClosedAfterConnect, "one bare close: a failed connect")
	require.Empty(t, c.protocol())
	require.NoError(t, c.connect(ctx), "the second falls back")
	require.Equal(t, "3.1.1", c.protocol())
	require.EqualValues(t, 2, g.V5())
	require.NoError(t, c.connect(ctx))
	require.Equal(t, "3.1.1", c.protocol())
	require.EqualValues(t, 2, g.V5(), "5 not tried again before retry5After")

	// Later, and the broker speaks 5 after all.
	g.SetMode(harness.GatePass)
	c.b.now = func() time.Time { return time.Now().Add(retry5After + time.Second) }
	require.NoError(t, c.connect(ctx))
	require.Equal(t, "5", c.protocol())
	require.EqualValues(t, 3, g.V5())

	// One bare close between successes does not fall back.
	g.SetMode(harness.GateClose)
	require.ErrorIs(t, c.connect(ctx), ErrClosedAfterConnect)
	g.SetMode(harness.GatePass)
	require.NoError(t, c.connect(ctx))
	require.Equal(t, "5", c.protocol())
	g.SetMode(harness.GateClose)
	require.ErrorIs(t, c.connect(ctx), ErrClosedAfterConnect, "the count starts again after a success")
}

// TestFallbackRule: Auto's rule, with a stand-in for the connection: a
// CONNACK without 5 falls back at once and for good, two bare closes in a
// row for retry5After; a forced version never falls back; an attempt ended
// by ctx teaches nothing; the addresses go round from the client id's.
func TestFallbackRule(t *testing.T) {
	var urls []*url.URL
	for _, s := range []string{"tcp://a:1", "tcp://b:1", "tcp://c:1"} {
		u, err := ParseURL(s)
		require.NoError(t, err)
		urls = append(urls, u)
	}
	b := NewBrokers(urls, "till-7", slog.New(slog.DiscardHandler), "")
	first := FirstBroker("till-7", 3)
	require.Equal(t, urls[first], b.Current())
	type try struct {
		host string
		v5   bool
	}
	var tries []try
	answer := map[string]error{}
	open := func(ctx context.Context, a *Attempt) error {
		tries = append(tries, try{a.URL.Hostname(), a.V5})
		if err := answer[a.URL.Hostname()]; err != nil && a.V5 {
			return err
		}
		a.Connected()
		return nil
	}
	ctx := context.Background()
	hosts := []string{"a", "b", "c"}
	host := func(i int) string { return hosts[(first+i)%3] }

	answer[host(0)] = ErrUnsupportedVersion
	require.NoError(t, b.Connect(ctx, Auto, open))
	require.Equal(t, []try{{host(0), true}, {host(0), false}}, tries, "no 5: 3.1.1 at once")
	require.Equal(t, urls[(first+0)%3], b.Current())
	tries = nil
	answer[host(1)] = ErrClosedAfterConnect
	require.ErrorIs(t, b.Connect(ctx, Auto, open), ErrClosedAfterConnect)
	require.NoError(t, b.Connect(ctx, Auto, open))
	require.Equal(t, []try{{host(1), true}, {host(2), true}}, tries, "the next address each time")
	tries = nil
	require.NoError(t, b.Connect(ctx, Auto, open))
	require.NoError(t, b.Connect(ctx, Auto, open))
	require.Equal(t, []try{{host(0), false}, {host(1), true}, {host(1), false}}, tries,
		"no 5 stays learnt; the second bare close falls back")

	tries = nil
	require.NoError(t, b.Connect(ctx, V5, open))
	require.ErrorIs(t, b.Connect(ctx, V5, open), ErrUnsupportedVersion)
	require.NoError(t, b.Connect(ctx, V311, open))
	require.Equal(t, []try{{host(2), true}, {host(0), true}, {host(1), false}}, tries, "a forced version never falls back")

	// Each address twice, ended by ctx: two bare closes of h2 that teach
	// nothing.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	answer[host(2)] = ErrClosedAfterConnect
	tries = nil
	for range 6 {
		b.Connect(cancelled, Auto, open)
	}
	require.Equal(t, []try{{host(2), true}, {host(0), false}, {host(1), false}, {host(2), true}, {host(0), false}, {host(1), false}}, tries)
	tries = nil
	require.ErrorIs(t, b.Connect(ctx, Auto, open), ErrClosedAfterConnect)
	require.Equal(t, []try{{host(2), true}}, tries, "the first bare close that counts: no fallback")
}

// TestParseURLSaysWhatIsWrong: each way a broker URL can be wrong is
// refused at once, saying what is wrong and what a good one looks like;
// none was retried for ever or failed with url.Parse's words.
func TestParseURLSaysWhatIsWrong(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"127.0.0.1:1883", `broker URL "127.0.0.1:1883" has no scheme: write tcp://127.0.0.1:1883 (or ssl://127.0.0.1:1883 for TLS)`},
		{"localhost:1883", `broker URL "localhost:1883" has no scheme: write tcp://localhost:1883`},
		{"", "broker URL is empty; want SCHEME://HOST:PORT, e.g. tcp://127.0.0.1:1883"},
		{"tcp://127.0.0.1:99999", `broker URL "tcp://127.0.0.1:99999": port 99999 is not 1 to 65535; want SCHEME://HOST:PORT, e.g. tcp://127.0.0.1:1883`},
		{"tcp://127.0.0.1:0", "port 0 is not 1 to 65535"},
		{"tcp://h:x", "want SCHEME://HOST:PORT, e.g. tcp://127.0.0.1:1883"},
		{"tcp://h", `broker URL "tcp://h" has no port: write tcp://h:1883 (8883 for TLS, or the broker's port)`},
		{"tcp://:1883", `broker URL "tcp://:1883" has no host; want SCHEME://HOST:PORT`},
		{"mqtt://host:1883/path", `broker URL "mqtt://host:1883/path": MQTT takes no path, query or fragment: write mqtt://host:1883`},
		{"tcp://host:1883?x=1", "MQTT takes no path, query or fragment: write tcp://host:1883"},
		{"tcp://host:1883#f", "MQTT takes no path, query or fragment: write tcp://host:1883"},
		{"http://host:80", `scheme "http": want tcp or mqtt (plain), or ssl, tls or mqtts (TLS)`},
		{"tcp://u:secret@host:1883", "credentials in a broker URL are not used"},
		{"u:secret@host:1883", "broker URL has no scheme; want SCHEME://HOST:PORT"},
	} {
		_, err := ParseURL(c.url)
		require.Error(t, err, c.url)
		require.Contains(t, err.Error(), c.want, c.url)
		require.NotContains(t, err.Error(), "secret", c.url)
	}
	for _, s := range []string{"tcp://127.0.0.1:1883", "mqtt://h:1", "ssl://h:8883/", "tls://[::1]:65535", "MQTTS://h:8883"} {
		_, err := ParseURL(s)
		require.NoError(t, err, s)
	}
}
