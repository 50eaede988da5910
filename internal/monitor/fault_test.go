package monitor

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/mqtt"
)

// connectErr is what an MQTTPublisher's Connect to broker returns: the
// error a relay keeps as its last, with every layer the real code puts
// around the cause.
func connectErr(t *testing.T, o outbox.MQTTOptions) error {
	t.Helper()
	o.ConnectTimeout, o.Logger = 2*time.Second, harness.TestLogger()
	if o.ClientID == "" {
		o.ClientID = "monitor-test"
	}
	pub, err := outbox.NewMQTTPublisher(o)
	require.NoError(t, err)
	defer pub.Close()
	err = pub.Connect(context.Background())
	require.Error(t, err)
	return err
}

// connack is a broker that answers every CONNECT with the CONNACK code of
// the version the client spoke.
func connack(t *testing.T, v5, v311 byte) string {
	return harness.StartFakeBroker(t, harness.FakeBrokerOptions{Connack: func(_ int, level byte) []byte {
		if level == 5 {
			return []byte{0x20, 3, 0, v5, 0}
		}
		return []byte{0x20, 2, 0, v311}
	}}).URL()
}

// tlsBroker is a TLS listener that completes the handshake with conf and
// then closes the connection: enough for a client to fail its handshake.
func tlsBroker(t *testing.T, conf *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return "ssl://" + ln.Addr().String()
}

// answering is a server that writes answer to every connection and closes
// it.
func answering(t *testing.T, answer string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(answer))
			c.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// TestExplainFault: each error a relay can keep as its last, made by the
// real code where that is cheap, in words with what to check.
func TestExplainFault(t *testing.T) {
	ca := harness.NewCA(t, "fleet-ca")
	server := ca.ServerCertificate(t)
	expiredPEM, expiredKey := ca.IssueExpiredServer(t, "broker")
	expired, err := tls.X509KeyPair(expiredPEM, expiredKey)
	require.NoError(t, err)
	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "tcp://" + free.Addr().String()
	free.Close()
	plain := harness.StartFakeBroker(t, harness.FakeBrokerOptions{})
	web := answering(t, "HTTP/1.0 400 Bad Request\r\n\r\n")

	now := time.Now()
	for _, c := range []struct {
		name        string
		err         func(t *testing.T) error
		now         time.Time // default now
		words, hint string
	}{
		{"broker away", func(t *testing.T) error { return connectErr(t, outbox.MQTTOptions{Broker: closed}) },
			now, "Nothing answers at 127.0.0.1:", "Is the broker running? Is its address right (--broker)?"},
		{"password refused, 5", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: connack(t, 0x86, 4), Protocol: outbox.Protocol5})
		}, now, "The broker refused the user name or password.", "--password-file"},
		{"password refused, 3.1.1", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: connack(t, 0x86, 4), Protocol: outbox.Protocol311})
		}, now, "The broker refused the user name or password.", "--username"},
		{"not authorised", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: connack(t, 0x87, 5), Protocol: outbox.Protocol5})
		}, now, "not authorised", "its operator must allow it"},
		{"client id rejected", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: connack(t, 0x85, 2), Protocol: outbox.Protocol311})
		}, now, "client id", "--client-id"},
		{"broker busy", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: connack(t, 0x89, 3), Protocol: outbox.Protocol5})
		}, now, "says it cannot take messages for now", "The broker's operator is needed."},
		{"broker unavailable, 3.1.1", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: connack(t, 0x88, 3), Protocol: outbox.Protocol311})
		}, now, "says it cannot take messages for now", "The broker's operator is needed."},
		{"TLS: unknown authority", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: tlsBroker(t, &tls.Config{Certificates: []tls.Certificate{server}}), TLSConfig: &tls.Config{}})
		}, now, "not signed by an authority this device trusts", "--ca-file"},
		{"TLS: another name", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: tlsBroker(t, &tls.Config{Certificates: []tls.Certificate{server}}),
				TLSConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "broker.example"}})
		}, now, "for another name", "--broker"},
		{"TLS: expired", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: tlsBroker(t, &tls.Config{Certificates: []tls.Certificate{expired}}), TLSConfig: &tls.Config{RootCAs: ca.Pool()}})
		}, now, "The broker's certificate expired on " + now.Add(-24*time.Hour).UTC().Format("2006-01-02"), "must renew it"},
		{"TLS: the device's clock is behind", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: tlsBroker(t, &tls.Config{Certificates: []tls.Certificate{expired}}), TLSConfig: &tls.Config{RootCAs: ca.Pool()}})
		}, now.Add(-72 * time.Hour), "This device's clock is wrong", "Set the device's clock"},
		{"TLS: client certificate refused", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: tlsBroker(t, &tls.Config{Certificates: []tls.Certificate{server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}),
				TLSConfig: &tls.Config{RootCAs: ca.Pool()}})
		}, now, "refused this device's TLS certificate", "--cert-file, --key-file"},
		{"TLS to a plain MQTT port", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: "ssl://" + plain.Addr(), TLSConfig: &tls.Config{RootCAs: ca.Pool()}})
		}, now, "closed the connection as this device connected", "ssl:// or mqtts://"},
		{"TLS to a web server", func(t *testing.T) error {
			return connectErr(t, outbox.MQTTOptions{Broker: "ssl://" + web, TLSConfig: &tls.Config{RootCAs: ca.Pool()}})
		}, now, "does not speak TLS", "tcp://"},
		{"name not found", func(*testing.T) error {
			return fmt.Errorf("outbox: mqtt 5 connect to tcp://brokr:1883: cannot connect: %w",
				&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "brokr", IsNotFound: true}})
		}, now, "The broker's name brokr cannot be found.", "spelt right"},
		{"disk full", func(*testing.T) error {
			return fmt.Errorf("outbox: relay: mark sent: %w: database or disk is full (13)", outbox.ErrDiskFull)
		}, now, "The device's disk is full", "Free space"},
		{"lease lost", func(*testing.T) error { return outbox.ErrLeaseLost }, now, "Another relay took over", "stop the extra one"},
		{"session taken over", func(*testing.T) error {
			return fmt.Errorf("outbox: connection lost: %w", &mqtt.DisconnectError{Code: 0x8E})
		}, now, "with this device's client id", "a client id of its own"},
		{"connection lost", func(*testing.T) error { return fmt.Errorf("outbox: publish: %w", outbox.ErrNotConnected) },
			now, "The connection to the broker was lost.", "reconnects by itself"},
		{"stalled", func(*testing.T) error { return fmt.Errorf("%w: write: i/o timeout", outbox.ErrStalled) },
			now, "stopped moving data", "check it"},
		{"message refused", func(*testing.T) error { return &outbox.Refusal{Reason: "not authorized (0x87)", Permanent: true} },
			now, "The broker refused a message.", "Dead messages"},
		{"unknown", func(*testing.T) error { return errors.New("something else") }, now, "not one this page knows", "the relay's log"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.err(t)
			f := explainFault(err, c.now)
			require.Contains(t, f.Words, c.words, "error: %v", err)
			require.Contains(t, f.Hint, c.hint, "error: %v", err)
		})
	}
}
