//go:build linux

package outbox

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestEjabberdTLS runs the relay against ejabberd's MQTT listener with TLS
// and client certificates (tls: true, tls_verify: true, c2s_cafile: the
// fleet CA). The node has that listener only and no password logins, so a
// client certificate is required, and the test's subscriber connects with
// one too. The right setup delivers; a wrong CA, no client certificate and
// an untrusted one each give one clear error, and the message stays
// pending and uncharged.
//
// ejabberd checks a client certificate after the handshake, not in it: its
// TLS layer asks for one (naming c2s_cafile's CA) but takes any, or none.
// At CONNECT, a client with no password is authenticated by its
// certificate: verified against c2s_cafile, its CN naming the MQTT user
// (the CONNECT user name, or the client id when there is none). So every
// refusal is a CONNACK 5 (not authorised) and only ejabberd's log says why
// ("TLS verify failed: ..." for one from the fleet CA's name and another
// key; one from another CA is not even sent, as ejabberd names the fleet CA
// in its request). A relay sets Username to its certificate's CN and no
// password. A certificate whose CN is a PrintableString, as Go's
// crypto/x509 and newBrokerTLS write it, is refused too, although it is
// from the right CA, and the log says no more than "Not authorized".
func TestEjabberdTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	b := harness.NewBrokerTLS(t)
	e := harness.StartEjabberd(t, harness.EjabberdOptions{TLS: &b.Server})
	// ejabberd reads the MQTT user from the CN only when it is a
	// UTF8String (OpenSSL's default), which Go's crypto/x509 does not write.
	cert, key := b.ClientUTF8.CertFile, b.ClientUTF8.KeyFile
	rogueCert, rogueKey := b.RogueUTF8.CertFile, b.RogueUTF8.KeyFile
	forgedCert, forgedKey := b.ForgedUTF8.CertFile, b.ForgedUTF8.KeyFile

	// The subscriber's user is the CN, till-7: its client id, as it sends no
	// user name.
	subTLS, err := TLSFiles{CAFile: b.CAFile, CertFile: cert, KeyFile: key}.Config()
	require.NoError(t, err)
	sub := harness.StartSubscriber(t, e.MQTTTLSAddr, harness.SubscriberOptions{ClientID: "till-7", Filter: "pos/#", TLS: subTLS}, eventIDSeq)

	const notAuthorised = "the broker refused this client: not authorised (CONNACK 5)"
	cases := []brokerTLSCase{
		{"right CA and client certificate", TLSFiles{CAFile: b.CAFile, CertFile: cert, KeyFile: key}, ""},
		{"wrong CA", TLSFiles{CAFile: b.OtherCAFile, CertFile: cert, KeyFile: key}, "signed by an unknown authority"},
		{"no client certificate", TLSFiles{CAFile: b.CAFile}, notAuthorised},
		{"client certificate from another CA", TLSFiles{CAFile: b.CAFile, CertFile: rogueCert, KeyFile: rogueKey}, notAuthorised},
		{"client certificate from a CA of the same name, another key", TLSFiles{CAFile: b.CAFile, CertFile: forgedCert, KeyFile: forgedKey}, notAuthorised},
		{"client certificate from the fleet CA, CN a PrintableString", TLSFiles{CAFile: b.CAFile, CertFile: b.Client.CertFile, KeyFile: b.Client.KeyFile}, notAuthorised},
	}
	runBrokerTLSCases(t, "ejabberd "+e.Version, e.MQTTTLSAddr, "till-7", cases)
	eventually(t, 10*time.Second, "the subscriber has it", func() bool { return sub.Log.Unique() == 1 })
	log, err := os.ReadFile(e.LogFile)
	require.NoError(t, err)
	require.Contains(t, string(log), "TLS verify failed", "the forged certificate's refusal, explained in the log only")
	require.Zero(t, sub.Log.Snapshot().DecodeErrors)
}
