package consumer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// A broker that accepts the connection and reads the client's first
// packet but never answers keeps paho waiting, for the CONNACK or the TLS
// handshake, until ConnectTimeout. Ending Run meanwhile must end that
// attempt too: nothing the subscriber started may outlive Run, and Run must
// not sit out the timeout.
func TestSubscriberCancelledDuringConnectLeavesNothing(t *testing.T) {
	forProtocols(t, testSubscriberCancelledDuringConnectLeavesNothing)
}

func testSubscriberCancelledDuringConnectLeavesNothing(t *testing.T, proto outbox.MQTTProtocol) {
	for _, tc := range []struct {
		scheme string
		first  byte // what the client sends first
	}{
		{"tcp", 0x10}, // MQTT CONNECT
		{"ssl", 0x16}, // TLS handshake record (ClientHello)
	} {
		t.Run(tc.scheme, func(t *testing.T) {
			db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
			in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
			require.NoError(t, err)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer ln.Close()
			s, err := NewSubscriber(in, recordApplied, SubscriberOptions{
				Broker: tc.scheme + "://" + ln.Addr().String(), ClientID: "consumer-1", Topics: []string{"pos/#"},
				ConnectTimeout: time.Minute, Logger: testLogger(), Protocol: proto,
			})
			require.NoError(t, err)
			// The silent broker runs on this goroutine, so every goroutine
			// alive at the end besides these is the subscriber's.
			before := goleak.IgnoreCurrent()

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()

			require.NoError(t, ln.(*net.TCPListener).SetDeadline(time.Now().Add(10*time.Second)))
			conn, err := ln.Accept()
			require.NoError(t, err)
			defer conn.Close() // only after the check: closing it would end paho's wait
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
			first := make([]byte, 1)
			_, err = io.ReadFull(conn, first)
			require.NoError(t, err)
			require.Equal(t, tc.first, first[0])

			start := time.Now()
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return after its context ended")
			}
			require.Less(t, time.Since(start), 5*time.Second, "Run waited for the connect timeout")
			goleak.VerifyNone(t, before)
		})
	}
}

// Stopping a connected subscriber: paho tears its goroutines down after
// Disconnect returns unless asked to wait, so they were still there,
// blocked, when Run returned. goleak retries until they are gone, which
// would hide that; this looks once, at the moment Run has returned.
func TestSubscriberStopLeavesNoPahoGoroutine(t *testing.T) {
	forProtocols(t, testSubscriberStopLeavesNoPahoGoroutine)
}

func testSubscriberStopLeavesNoPahoGoroutine(t *testing.T, proto outbox.MQTTProtocol) {
	b := startBroker(t)
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)
	// Before the fix about half the stops left some behind; 30 make a
	// pass by luck out of the question.
	for i := 0; i < 30; i++ {
		s, err := NewSubscriber(in, recordApplied, SubscriberOptions{
			Broker: b.url(), ClientID: "consumer-1", Topics: []string{"pos/#"}, Logger: testLogger(), Protocol: proto,
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		eventually(t, 5*time.Second, "subscriber connected", func() bool { return s.Stats().Connected })
		cancel()
		require.NoError(t, <-done)
		if proto == outbox.Protocol5 {
			// paho.golang hands a read error to goroutines of its own
			// (Client.error, OnClientError) that nobody joins and that
			// may start as Run returns: they close the client, already
			// closed, and end. They must end soon, not be absent at once.
			eventually(t, 5*time.Second, fmt.Sprintf("stop %d: paho.golang's goroutines ended", i), func() bool {
				return len(blockedPahoGoroutines("")) == 0
			})
			continue
		}
		require.Empty(t, blockedPahoGoroutines(""), "stop %d: paho goroutines outlived Run", i)
	}
}

// blockedPahoGoroutines returns the headers of goroutines in paho that are
// waiting for something (and whose stack holds in). One that is runnable or running may be on its
// way out (it has just closed the channel Run waited on), so it is not
// counted.
func blockedPahoGoroutines(in string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, "\n")
		if !strings.Contains(g, "github.com/eclipse/paho") || !strings.Contains(g, in) ||
			strings.Contains(head, "[runnable") || strings.Contains(head, "[running") {
			continue
		}
		out = append(out, head)
	}
	return out
}

// The subscriber opens its TLS connections itself (so that they can be
// aborted): the broker's certificate must still be checked against the
// configured roots and the URL's host.
func TestSubscriberOverTLS(t *testing.T) {
	forProtocols(t, testSubscriberOverTLS)
}

func testSubscriberOverTLS(t *testing.T, proto outbox.MQTTProtocol) {
	ca, rogue := harness.NewCA(t, "brokers-ca"), harness.NewCA(t, "rogue-ca")
	b := harness.StartMochi(t, harness.MochiOptions{TLS: &tls.Config{
		Certificates: []tls.Certificate{ca.ServerCertificate(t)}, MinVersion: tls.VersionTLS12,
	}})
	db := consumerDB(t, filepath.Join(t.TempDir(), "consumer.db"))
	in, err := NewInbox(context.Background(), db, InboxOptions{Logger: testLogger()})
	require.NoError(t, err)

	run := func(roots *x509.CertPool, clientID string) *Subscriber {
		s, err := NewSubscriber(in, recordApplied, SubscriberOptions{
			Broker: b.URL(), ClientID: clientID, Topics: []string{"pos/#"},
			TLSConfig:      &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			Reconnect:      outbox.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
			ConnectTimeout: 5 * time.Second, Logger: testLogger(), Protocol: proto,
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
		return s
	}

	bad := run(rogue.Pool(), "consumer-rogue")
	eventually(t, 10*time.Second, "the rogue-rooted subscriber to fail", func() bool { return bad.Stats().LastError != "" })
	require.Contains(t, bad.Stats().LastError, "certificate")
	require.False(t, bad.Stats().Connected)

	good := run(ca.Pool(), "consumer-1")
	eventually(t, 10*time.Second, "subscriber connected over TLS", func() bool { return good.Stats().Connected })
	ev := `{"specversion":"1.0","id":"e1","source":"/till/1","type":"t","sequence":"1","data":{"n":1}}`
	require.NoError(t, b.Server().Publish("pos/orders", []byte(ev), false, 1))
	eventually(t, 10*time.Second, "event applied", func() bool { return appliedCount(t, db) == 1 })
}

// TestSubscriberResumesLargeBacklog: a consumer that comes back to a
// persistent session holding more events than its hand-over queue (256)
// used to hang for good: the broker sends the session's messages before it
// answers the SUBSCRIBE, paho's one delivery goroutine blocked handing them
// over, and the subscriber only began taking them once the SUBACK came,
// which that goroutine would have had to read.
//
// Over MQTT 5 against mochi it failed three more ways: the SUBSCRIBE refused
// (0x91, mochi gives its messages' packet ids the client's SUBSCRIBE may
// take), paho's pinger giving up on the connection while the PINGRESP
// waited behind the backlog, and then messages lost (mochi forgets what it
// sent beyond the client's Receive Maximum).
func TestSubscriberResumesLargeBacklog(t *testing.T) {
	forProtocols(t, testSubscriberResumesLargeBacklog)
}

func testSubscriberResumesLargeBacklog(t *testing.T, proto outbox.MQTTProtocol) {
	c := newConsumerSetup(t)
	useProto := func(o *SubscriberOptions) { o.Protocol = proto }
	_, stop := c.subscriber(t, recordApplied, useProto)
	stop() // the session stays, the consumer is away
	const n = 1000
	for i := 0; i < n; i++ {
		commitOrder(t, c.ob, "pos/orders", i)
	}
	eventually(t, 20*time.Second, "the relay published them", func() bool { return countState(t, c.ob, "pending") == 0 })
	c.subscriber(t, recordApplied, useProto)
	eventually(t, 30*time.Second, "the backlog applied", func() bool { return appliedCount(t, c.db) == n })
}
