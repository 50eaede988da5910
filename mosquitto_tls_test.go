package outbox

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startMosquittoTLS runs a Mosquitto with one TLS listener that requires a
// client certificate from ca and a password file, and returns its address.
func startMosquittoTLS(t *testing.T, dir string, ca *testPKI, serverCert, serverKey []byte, user, password string) string {
	t.Helper()
	bin := mosquittoBinary()
	if bin == "" {
		t.Skip("mosquitto is not installed (looked in PATH and /usr/sbin): apt-get install -y mosquitto")
	}
	passwd, err := exec.LookPath("mosquitto_passwd")
	if err != nil {
		t.Skip("mosquitto_passwd is not installed")
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	caFile, certFile, keyFile := write("broker-ca.pem", ca.pem), write("broker.pem", serverCert), write("broker.key", serverKey)
	pwFile := write("passwords", nil)
	out, err := exec.Command(passwd, "-b", pwFile, user, password).CombinedOutput()
	require.NoError(t, err, "%s", out)
	port, err := freeLoopbackPort()
	require.NoError(t, err)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	conf := fmt.Sprintf(`listener %d 127.0.0.1
cafile %s
certfile %s
keyfile %s
require_certificate true
tls_version tlsv1.2
allow_anonymous false
password_file %s
persistence false
log_dest stderr
`, port, caFile, certFile, keyFile, pwFile)
	if os.Geteuid() == 0 {
		conf += "user root\n"
	}
	confFile := write("mosquitto.conf", []byte(conf))
	runServer(t, "mosquitto (TLS)", filepath.Join(dir, "mosquitto.log"), "running", addr, bin, "-c", confFile)
	return addr
}

// expiredServerCert is a server certificate for 127.0.0.1 that expired a
// day ago.
func (p *testPKI) expiredServerCert(t *testing.T) (certPEM, keyPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "expired-broker"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// TestMosquittoTLS runs the relay against a real Mosquitto with a TLS
// listener that requires a client certificate and a password: the right
// setup delivers; no certificate, a wrong CA, an expired broker certificate
// and a wrong password each give one clear error, and in every case the
// message stays pending and uncharged (TestMutualTLSAndCertificateReload
// shows it delivered once the setup is put right).
func TestMosquittoTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	dir := t.TempDir()
	ca, other := newTestPKI(t, "fleet-ca"), newTestPKI(t, "other-ca")
	srvCert, srvKey := ca.issue(t, "broker", true)
	addr := startMosquittoTLS(t, dir, ca, srvCert, srvKey, "till7", "right-password")
	expiredCert, expiredKey := ca.expiredServerCert(t)
	expiredAddr := startMosquittoTLS(t, t.TempDir(), ca, expiredCert, expiredKey, "till7", "right-password")

	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	caFile, otherCAFile := write("ca.pem", ca.pem), write("other-ca.pem", other.pem)
	c, k := ca.issue(t, "till-7", false)
	certFile, keyFile := write("till.pem", c), write("till.key", k)

	cases := []struct {
		name     string
		addr     string
		files    TLSFiles
		password string
		want     string // in the relay's last error; "" means delivered
	}{
		{"right certificate and password", addr, TLSFiles{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}, "right-password", ""},
		{"no client certificate", addr, TLSFiles{CAFile: caFile}, "right-password", "the broker refused the TLS handshake"},
		{"wrong CA", addr, TLSFiles{CAFile: otherCAFile, CertFile: certFile, KeyFile: keyFile}, "right-password", "signed by an unknown authority"},
		{"expired broker certificate", expiredAddr, TLSFiles{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}, "right-password", `"expired-broker" expired at`},
		{"wrong password", addr, TLSFiles{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}, "wrong", "not authorised (CONNACK 5)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ob := openTest(t, Options{})
			commitOrder(t, ob, "pos/orders", 1)
			pub, err := NewMQTTPublisher(MQTTOptions{Broker: "ssl://" + tc.addr, ClientID: "till-7-" + NewID()[30:],
				Username: "till7", Password: tc.password, TLSFiles: &tc.files, ConnectTimeout: 3 * time.Second})
			require.NoError(t, err)
			t.Cleanup(func() { pub.Close() })
			opts := fastRelay()
			opts.Reconnect = Backoff{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
			r, err := ob.NewRelay(pub, opts)
			require.NoError(t, err)
			startRelay(t, r)
			if tc.want == "" {
				eventually(t, 10*time.Second, "delivered", func() bool { return countState(t, ob, "sent") == 1 })
				return
			}
			var last string
			eventually(t, 10*time.Second, "an error", func() bool {
				s, _ := r.Stats(context.Background())
				last = s.LastError
				return strings.Contains(last, tc.want)
			})
			require.NotContains(t, last, tc.password)
			require.NotContains(t, last, "\n", "one line")
			t.Logf("%s: %s", tc.name, last)
			state, attempts := rowState(t, ob, 1)
			require.Equal(t, "pending", state, "nothing lost, nothing dead")
			require.Zero(t, attempts, "a configuration problem never counts against a message")
		})
	}
}
