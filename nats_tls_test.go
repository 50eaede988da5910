package outbox

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// clientTLS is a TLS configuration with the fleet CA and client
// certificate, for a test's own subscriber.
func clientTLS(t *testing.T, b *harness.BrokerTLS) *tls.Config {
	cfg, err := TLSFiles{CAFile: b.CAFile, CertFile: b.Client.CertFile, KeyFile: b.Client.KeyFile}.Config()
	require.NoError(t, err)
	return cfg
}

// brokerTLSCase is one relay configuration against a TLS listener; want is
// in the relay's last error, "" means delivered.
type brokerTLSCase struct {
	name  string
	files TLSFiles
	want  string
}

// brokerTLSCases are the TLS cases every broker's listener that requires
// a client certificate is run through.
func brokerTLSCases(b *harness.BrokerTLS) []brokerTLSCase {
	return []brokerTLSCase{
		{"right CA and client certificate", TLSFiles{CAFile: b.CAFile, CertFile: b.Client.CertFile, KeyFile: b.Client.KeyFile}, ""},
		{"wrong CA", TLSFiles{CAFile: b.OtherCAFile, CertFile: b.Client.CertFile, KeyFile: b.Client.KeyFile}, "signed by an unknown authority"},
		{"no client certificate", TLSFiles{CAFile: b.CAFile}, "the broker refused the TLS handshake"},
		{"client certificate from another CA", TLSFiles{CAFile: b.CAFile, CertFile: b.Rogue.CertFile, KeyFile: b.Rogue.KeyFile}, "the broker refused the TLS handshake"},
		{"client certificate from a CA of the same name, another key", TLSFiles{CAFile: b.CAFile, CertFile: b.Forged.CertFile, KeyFile: b.Forged.KeyFile}, "the broker refused the TLS handshake"},
	}
}

// runBrokerTLSCases runs a relay for each case against the TLS listener at
// addr, each with one committed message: delivered and marked sent, or the
// expected error, one line, with the message pending and uncharged (a
// configuration problem is an outage, not the message's fault). It returns
// each failing case's last error, by case name. username, if set, is the
// MQTT user name the relays log in with.
func runBrokerTLSCases(t *testing.T, broker, addr, username string, cases []brokerTLSCase) map[string]string {
	errs := map[string]string{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ob := openTest(t, Options{})
			commitOrder(t, ob, "pos/orders", 1)
			pub, err := NewMQTTPublisher(MQTTOptions{Broker: "ssl://" + addr, ClientID: "till-7-" + NewID()[30:], Username: username,
				TLSFiles: &tc.files, ConnectTimeout: 3 * time.Second})
			require.NoError(t, err)
			t.Cleanup(func() { pub.Close() })
			opts := fastRelay()
			opts.Reconnect = Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
			r, err := ob.NewRelay(pub, opts)
			require.NoError(t, err)
			startRelay(t, r)
			if tc.want == "" {
				eventually(t, 10*time.Second, "marked sent", func() bool { return countState(t, ob, "sent") == 1 })
				return
			}
			var last string
			eventually(t, 10*time.Second, "an error", func() bool {
				s, _ := r.Stats(context.Background())
				last = s.LastError
				return strings.Contains(last, tc.want)
			})
			require.NotContains(t, last, "\n", "one line")
			t.Logf("%s, %s: %s", broker, tc.name, last)
			errs[tc.name] = last
			state, attempts := rowState(t, ob, 1)
			require.Equal(t, "pending", state, "nothing lost, nothing dead")
			require.Zero(t, attempts, "a configuration problem never counts against a message")
		})
	}
	return errs
}

// TestNATSTLS runs the relay against NATS Server's MQTT listener with TLS
// that requires a client certificate from the fleet CA (verify: true). NATS
// has one MQTT listener, so it is TLS-only here and the test's subscriber
// connects with a client certificate too. The right setup delivers; a wrong
// CA, no client certificate and an untrusted one each give one clear error,
// and the message stays pending and uncharged. NATS sends "bad
// certificate" for both a missing and an untrusted client certificate; only
// its log tells them apart.
func TestNATSTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	b := harness.NewBrokerTLS(t)
	n := harness.StartNATS(t, fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }", b.Server.CertFile, b.Server.KeyFile, b.Server.CAFile))
	sub := harness.StartSubscriber(t, n.MQTTAddr, harness.SubscriberOptions{ClientID: "nats-consumer", Filter: "pos/#", TLS: clientTLS(t, b)}, eventIDSeq)
	runBrokerTLSCases(t, "NATS", n.MQTTAddr, "", brokerTLSCases(b))
	eventually(t, 10*time.Second, "the subscriber has it", func() bool { return sub.Log.Unique() == 1 })
	require.Zero(t, sub.Log.Snapshot().DecodeErrors)
}
