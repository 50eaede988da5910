//go:build linux

package outbox

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ejabberdClientCert issues a client certificate from ca whose subject CN
// is a UTF8String, and writes it and its key to dir. ejabberd reads the
// MQTT user from the CN only when it is a UTF8String (OpenSSL's default);
// Go's crypto/x509 writes a CN such as "till-7" as a PrintableString,
// which ejabberd does not take for a name at all.
func ejabberdClientCert(t *testing.T, dir, name string, ca *testPKI, cn string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	subject, err := asn1.Marshal(pkix.RDNSequence{{{
		Type:  asn1.ObjectIdentifier{2, 5, 4, 3}, // commonName
		Value: asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagUTF8String, Bytes: []byte(cn)},
	}}})
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), RawSubject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile
}

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
	b := newBrokerTLS(t)
	e := startEjabberdWith(t, ejabberdOptions{tls: &rabbitTLS{caFile: b.caFile, certFile: b.serverCert, keyFile: b.serverKey}})
	dir := t.TempDir()
	cert, key := ejabberdClientCert(t, dir, "till", b.ca, "till-7")
	rogueCert, rogueKey := ejabberdClientCert(t, dir, "rogue", newTestPKI(t, "other-ca"), "till-7")
	forgedCert, forgedKey := ejabberdClientCert(t, dir, "forged", newTestPKI(t, "fleet-ca"), "till-7")

	// The subscriber's user is the CN, till-7: its client id, as it sends no
	// user name.
	subTLS, err := TLSFiles{CAFile: b.caFile, CertFile: cert, KeyFile: key}.Config()
	require.NoError(t, err)
	sub := startTLSSubscriber(t, e.mqttTLSAddr, subTLS, "till-7", "pos/#")

	const notAuthorised = "the broker refused this client: not authorised (CONNACK 5)"
	cases := []brokerTLSCase{
		{"right CA and client certificate", TLSFiles{CAFile: b.caFile, CertFile: cert, KeyFile: key}, ""},
		{"wrong CA", TLSFiles{CAFile: b.otherCAFile, CertFile: cert, KeyFile: key}, "signed by an unknown authority"},
		{"no client certificate", TLSFiles{CAFile: b.caFile}, notAuthorised},
		{"client certificate from another CA", TLSFiles{CAFile: b.caFile, CertFile: rogueCert, KeyFile: rogueKey}, notAuthorised},
		{"client certificate from a CA of the same name, another key", TLSFiles{CAFile: b.caFile, CertFile: forgedCert, KeyFile: forgedKey}, notAuthorised},
		{"client certificate from the fleet CA, CN a PrintableString", TLSFiles{CAFile: b.caFile, CertFile: b.certFile, KeyFile: b.keyFile}, notAuthorised},
	}
	runBrokerTLSCases(t, "ejabberd "+e.version, e.mqttTLSAddr, "till-7", cases)
	eventually(t, 10*time.Second, "the subscriber has it", func() bool { return sub.unique() == 1 })
	log, err := os.ReadFile(e.logFile)
	require.NoError(t, err)
	require.Contains(t, string(log), "TLS verify failed", "the forged certificate's refusal, explained in the log only")
	sub.mu.Lock()
	defer sub.mu.Unlock()
	require.Zero(t, sub.decodeErrs)
}
