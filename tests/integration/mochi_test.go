package integration

import (
	"crypto/tls"
	"testing"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// mochi v2, in-process: the default broker of the tests and the demo. It
// speaks MQTT 5 and 3.1.1. It sends the PUBACK before routing to
// subscribers, and refuses a publish its ACL denies by closing the
// connection under 3.1.1, with PUBACK 0x87 under 5. Its TLS listener is a
// broker of its own (the suite's subscriber is inside the broker either
// way). It keeps no session across a restart.
var mochiKind = brokerKind{
	name:     "mochi",
	features: features{MQTT5: true, DeniedReason5: "not authorized (0x87)", TLSOnly: true},
	start:    startMochiSet,
}

func TestMochi(t *testing.T) { runBrokerSuite(t, mochiKind) }

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
	}
}

// inline subscribes inside m: what it routes to filter goes to the log.
func inline(m *harness.Mochi) func(t *testing.T, filter string) *harness.EventLog {
	return func(t *testing.T, filter string) *harness.EventLog {
		log := harness.NewEventLog(eventIDSeq)
		require.NoError(t, m.Subscribe(filter, func(msg harness.Message) { log.Add(msg.Payload) }))
		return log
	}
}
