package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority that issues certificates for tests, valid
// for an hour either side of now.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte // the CA's certificate
}

// NewCA makes a CA whose subject CN is name.
func NewCA(tb TB, name string) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(tb, err, "CA key")
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(tb, err, "CA certificate")
	cert, err := x509.ParseCertificate(der)
	must(tb, err, "CA certificate")
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool is a certificate pool holding this CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue returns a certificate and its key in PEM for a server (with the IP
// SAN 127.0.0.1) or a client, with the subject CN cn.
func (ca *CA) Issue(tb TB, cn string, server bool) (certPEM, keyPEM []byte) {
	tb.Helper()
	tmpl := leaf(cn, server)
	tmpl.Subject = pkix.Name{CommonName: cn}
	return ca.sign(tb, tmpl)
}

// IssueExpiredServer returns a server certificate for 127.0.0.1 that
// expired a day ago, and its key.
func (ca *CA) IssueExpiredServer(tb TB, cn string) (certPEM, keyPEM []byte) {
	tb.Helper()
	tmpl := leaf(cn, true)
	tmpl.Subject = pkix.Name{CommonName: cn}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)
	return ca.sign(tb, tmpl)
}

// IssueUTF8Client returns a client certificate whose subject CN is a
// UTF8String, as OpenSSL writes it. Go's crypto/x509 writes a CN such as
// "till-7" as a PrintableString, which some brokers (ejabberd) do not take
// for a name at all.
func (ca *CA) IssueUTF8Client(tb TB, cn string) (certPEM, keyPEM []byte) {
	tb.Helper()
	subject, err := asn1.Marshal(pkix.RDNSequence{{{
		Type:  asn1.ObjectIdentifier{2, 5, 4, 3}, // commonName
		Value: asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagUTF8String, Bytes: []byte(cn)},
	}}})
	must(tb, err, "subject")
	tmpl := leaf(cn, false)
	tmpl.RawSubject = subject
	return ca.sign(tb, tmpl)
}

// ServerCertificate is a server certificate for 127.0.0.1, for a listener
// in this process.
func (ca *CA) ServerCertificate(tb TB) tls.Certificate {
	tb.Helper()
	c, k := ca.Issue(tb, "broker", true)
	cert, err := tls.X509KeyPair(c, k)
	must(tb, err, "server certificate")
	return cert
}

// leaf is the template of a certificate this CA issues.
func leaf(cn string, server bool) *x509.Certificate {
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if server {
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	return tmpl
}

func (ca *CA) sign(tb TB, tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(tb, err, "key")
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	must(tb, err, "certificate")
	kder, err := x509.MarshalECPrivateKey(key)
	must(tb, err, "key")
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// ServerTLS is a broker's TLS listener in files (PEM): its certificate and
// key, and the CA it takes client certificates from.
type ServerTLS struct {
	CAFile, CertFile, KeyFile string
}

// KeyPair is a certificate and its key in files (PEM).
type KeyPair struct {
	CertFile, KeyFile string
}

// BrokerTLS is the PKI for a broker's MQTT TLS listener, in files: a
// server certificate for 127.0.0.1 from the fleet CA, which is also the
// only CA the broker takes client certificates from, and the certificates
// a client may present, good and bad. Each client certificate's CN is
// till-7.
type BrokerTLS struct {
	CA          *CA
	Server      ServerTLS // for the broker
	Expired     ServerTLS // the same, with a certificate that expired a day ago
	CAFile      string    // the fleet CA
	OtherCAFile string    // another CA

	Client KeyPair // from the fleet CA
	Rogue  KeyPair // from another CA
	// Forged is from a CA of the fleet CA's name but another key (an
	// impostor, or a CA re-keyed on one side only): a client's TLS stack
	// offers it, as it names an issuer the broker asked for, so the broker
	// itself must reject it. A certificate from a differently named CA is
	// not even sent (crypto/tls sends none the broker did not ask for): the
	// broker sees none.
	Forged KeyPair

	// The same three with the CN a UTF8String (IssueUTF8Client).
	ClientUTF8, RogueUTF8, ForgedUTF8 KeyPair
}

// NewBrokerTLS makes the PKI and writes its files in a directory of tb's.
func NewBrokerTLS(tb TB) *BrokerTLS {
	tb.Helper()
	dir := tb.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		must(tb, os.WriteFile(p, b, 0o600), name)
		return p
	}
	// pair(name)(cert, key) writes name.pem and name.key.
	pair := func(name string) func(cert, key []byte) KeyPair {
		return func(cert, key []byte) KeyPair {
			return KeyPair{CertFile: write(name+".pem", cert), KeyFile: write(name+".key", key)}
		}
	}
	ca, other, forger := NewCA(tb, "fleet-ca"), NewCA(tb, "other-ca"), NewCA(tb, "fleet-ca")
	b := &BrokerTLS{CA: ca, CAFile: write("ca.pem", ca.PEM), OtherCAFile: write("other-ca.pem", other.PEM)}
	server := pair("broker")(ca.Issue(tb, "broker", true))
	b.Server = ServerTLS{CAFile: b.CAFile, CertFile: server.CertFile, KeyFile: server.KeyFile}
	expired := pair("expired-broker")(ca.IssueExpiredServer(tb, "expired-broker"))
	b.Expired = ServerTLS{CAFile: b.CAFile, CertFile: expired.CertFile, KeyFile: expired.KeyFile}
	b.Client = pair("till")(ca.Issue(tb, "till-7", false))
	b.Rogue = pair("rogue")(other.Issue(tb, "till-7", false))
	b.Forged = pair("forged")(forger.Issue(tb, "till-7", false))
	b.ClientUTF8 = pair("till-utf8")(ca.IssueUTF8Client(tb, "till-7"))
	b.RogueUTF8 = pair("rogue-utf8")(other.IssueUTF8Client(tb, "till-7"))
	b.ForgedUTF8 = pair("forged-utf8")(forger.IssueUTF8Client(tb, "till-7"))
	return b
}
