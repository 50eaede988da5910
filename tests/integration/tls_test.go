package integration

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// tlsCase is one relay configuration against a TLS listener; want is in
// the relay's last error, "" means delivered.
type tlsCase struct {
	name  string
	addr  string
	files outbox.TLSFiles
	login login
	want  string
}

const (
	refusedHandshake = "the broker refused the TLS handshake"
	notAuthorised    = "the broker refused this client: not authorised (CONNACK 5)"
	notAuthorized5   = "the broker refused this client: not authorized (CONNACK 0x87)"
)

// tlsCasesFor are the TLS cases a broker's listener that requires a client
// certificate from the fleet CA is run through: the right set-up, a wrong
// CA, no client certificate, one from another CA and one from a CA of the
// fleet CA's name but another key; and where the broker has them, a
// certificate whose CN the broker cannot read, an expired broker
// certificate and a wrong password.
func tlsCasesFor(f traits, b *harness.BrokerTLS, tg *target) []tlsCase {
	client, rogue, forged := b.Client, b.Rogue, b.Forged
	if f.UTF8CommonName {
		client, rogue, forged = b.ClientUTF8, b.RogueUTF8, b.ForgedUTF8
	}
	refused := refusedHandshake
	if f.CertCheckedAtLogin {
		refused = notAuthorised
	}
	files := func(ca string, p harness.KeyPair) outbox.TLSFiles {
		return outbox.TLSFiles{CAFile: ca, CertFile: p.CertFile, KeyFile: p.KeyFile}
	}
	cases := []tlsCase{
		{"right CA and client certificate", tg.tlsAddr, files(b.CAFile, client), tg.login, ""},
		{"wrong CA", tg.tlsAddr, files(b.OtherCAFile, client), tg.login, "signed by an unknown authority"},
		{"no client certificate", tg.tlsAddr, outbox.TLSFiles{CAFile: b.CAFile}, tg.login, refused},
		{"client certificate from another CA", tg.tlsAddr, files(b.CAFile, rogue), tg.login, refused},
		{"client certificate from a CA of the same name, another key", tg.tlsAddr, files(b.CAFile, forged), tg.login, refused},
	}
	if f.UTF8CommonName {
		cases = append(cases, tlsCase{"client certificate from the fleet CA, CN a PrintableString", tg.tlsAddr, files(b.CAFile, b.Client), tg.login, notAuthorised})
	}
	if tg.expiredAddr != "" {
		cases = append(cases, tlsCase{"expired broker certificate", tg.expiredAddr, files(b.CAFile, client), tg.login, `"expired-broker" expired at`})
	}
	if tg.login.password != "" {
		cases = append(cases, tlsCase{"wrong password", tg.tlsAddr, files(b.CAFile, client), login{tg.login.username, "wrong"}, notAuthorised})
	}
	return cases
}

// tlsCases runs a relay for each TLS case, each with one committed
// message: delivered and marked sent, or the expected error, one line,
// with the message pending and uncharged (a configuration problem is an
// outage, not the message's fault). A subscriber checks that the right
// set-up's message arrived.
func tlsCases(t *testing.T, k brokerKind, set *brokerSet) {
	tg := set.tls
	if tg == nil {
		t.Skipf("%s: TLS is not tested", k.name)
	}
	var sub *harness.EventLog
	if k.traits.TLSOnly && tg.inline == nil {
		client := set.pki.Client
		if k.traits.UTF8CommonName {
			client = set.pki.ClientUTF8
		}
		cfg, err := outbox.TLSFiles{CAFile: set.pki.CAFile, CertFile: client.CertFile, KeyFile: client.KeyFile}.Config()
		require.NoError(t, err)
		sub = tlsSubscriber(t, tg, cfg)
	} else {
		sub = tg.subscribe(t, "tls-consumer", "pos/#")
	}
	for _, tc := range tlsCasesFor(k.traits, set.pki, tg) {
		if tc.want == notAuthorised && tg.proto == outbox.Protocol5 {
			tc.want = notAuthorized5
		}
		t.Run(tc.name, func(t *testing.T) { runTLSCase(t, tg.name, tc, tg.proto) })
	}
	harness.Eventually(t, 10*time.Second, "the subscriber has it", func() bool { return sub.Unique() == 1 })
	require.Zero(t, sub.Snapshot().DecodeErrors)
	if set.tlsLogSays != "" {
		require.Contains(t, tg.log(), set.tlsLogSays, "a refusal explained in the broker's log only")
	}
}

// tlsSubscriber is a subscriber on the TLS listener, with the fleet's
// client certificate.
func tlsSubscriber(t *testing.T, tg *target, cfg *tls.Config) *harness.EventLog {
	t.Helper()
	return harness.StartSubscriber(t, tg.tlsAddr, harness.SubscriberOptions{ClientID: "tls-consumer" + tg.suffix, Filter: "pos/#",
		Username: tg.login.username, Password: tg.login.password, TLS: cfg}, eventIDSeq).Log
}

func runTLSCase(t *testing.T, broker string, tc tlsCase, proto outbox.MQTTProtocol) {
	ob := openTest(t, outbox.Options{})
	commitOrder(t, ob, "pos/orders", 1)
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: "ssl://" + tc.addr, ClientID: "till-7-" + outbox.NewID()[30:],
		Username: tc.login.username, Password: tc.login.password, TLSFiles: &tc.files, ConnectTimeout: 3 * time.Second, Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	opts := fastRelay()
	opts.Reconnect = outbox.Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	if tc.want == "" {
		harness.Eventually(t, 10*time.Second, "marked sent", func() bool { return countState(t, ob, "sent") == 1 })
		return
	}
	var last string
	harness.Eventually(t, 10*time.Second, "an error", func() bool {
		s, _ := r.Stats(context.Background())
		last = s.LastError
		return strings.Contains(last, tc.want)
	})
	if tc.login.password != "" {
		require.NotContains(t, last, tc.login.password)
	}
	require.NotContains(t, last, "\n", "one line")
	t.Logf("%s, %s: %s", broker, tc.name, last)
	state, attempts := rowState(t, ob, 1)
	require.Equal(t, "pending", state, "nothing lost, nothing dead")
	require.Zero(t, attempts, "a configuration problem never counts against a message")
}
