package integration

import (
	"crypto/tls"
	"testing"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/outboxtest"
)

// mochi v2, in-process: the default broker of the tests and the demo. It
// speaks MQTT 5 and 3.1.1. It sends the PUBACK before routing to
// subscribers, and refuses a publish its ACL denies by closing the
// connection under 3.1.1, with PUBACK 0x87 under 5. It tells MQTT 5
// clients a Receive Maximum (1,024 by default; a broker of the window case
// less). Its TLS listener is a broker of its own (the subscribers are
// inside the broker either way). It keeps no session across a restart.
var mochiKind = brokerKind{
	name:      "mochi",
	mqtt5:     true,
	denied5:   outboxtest.Features{Refusal: outboxtest.RefusedForGood, RefusalReason: "not authorized (0x87)"},
	denied311: outboxtest.Features{Refusal: outboxtest.RefusedByClosing},
	traits:    traits{TLSOnly: true},
	start:     startMochiSet,
}

func TestMochi(t *testing.T) { runBrokerTests(t, mochiKind) }

func startMochiSet(t *testing.T, pki *harness.BrokerTLS) *brokerSet {
	plain := harness.StartMochi(t, harness.MochiOptions{Hooks: []mochi.Hook{&harness.DenyPublish{Prefix: "denied/"}}})
	server, err := tls.LoadX509KeyPair(pki.Server.CertFile, pki.Server.KeyFile)
	require.NoError(t, err)
	secure := harness.StartMochi(t, harness.MochiOptions{TLS: &tls.Config{
		Certificates: []tls.Certificate{server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pki.CA.Pool(), MinVersion: tls.VersionTLS12,
	}})
	pt := &target{name: "mochi", addr: plain.Addr(), inline: inline(plain)}
	return &brokerSet{
		plain:  pt,
		tls:    &target{name: "mochi", tlsAddr: secure.Addr(), inline: inline(secure)},
		denial: &denial{target: pt, allowed: "pos/orders", denied: "denied/orders", filter: "pos/#"},
		limited: func(t *testing.T, limit int) *target {
			m := harness.StartMochi(t, harness.MochiOptions{Capabilities: func(c *mochi.Capabilities) { c.ReceiveMaximum = uint16(limit) }})
			return &target{name: "mochi", addr: m.Addr(), inline: inline(m)}
		},
	}
}

// inline subscribes inside m: fn gets each payload it routes to filter.
func inline(m *harness.Mochi) func(t *testing.T, filter string, fn func(payload []byte)) {
	return func(t *testing.T, filter string, fn func(payload []byte)) {
		require.NoError(t, m.Subscribe(filter, func(msg harness.Message) { fn(msg.Payload) }))
	}
}
