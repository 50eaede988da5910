package outbox

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestMutualTLSAndCertificateReload: a broker that requires a client
// certificate refuses one from the wrong CA, clearly and without counting
// against any message; once the right certificate is put on disk, the next
// connection uses it.
func TestMutualTLSAndCertificateReload(t *testing.T) {
	forProtocols(t, testMutualTLSAndCertificateReload)
}

func testMutualTLSAndCertificateReload(t *testing.T, proto MQTTProtocol) {
	dir := t.TempDir()
	ca, rogue := harness.NewCA(t, "devices-ca"), harness.NewCA(t, "rogue-ca")

	b := harness.StartMochi(t, harness.MochiOptions{TLS: &tls.Config{
		Certificates: []tls.Certificate{ca.ServerCertificate(t)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(), MinVersion: tls.VersionTLS12,
	}})
	got := make(chan []byte, 10)
	require.NoError(t, b.Subscribe("pos/#", func(m harness.Message) { got <- m.Payload }))

	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "till.pem"), filepath.Join(dir, "till.key")
	require.NoError(t, os.WriteFile(caFile, ca.PEM, 0o600))
	write := func(p *harness.CA) {
		c, k := p.Issue(t, "till-7", false)
		require.NoError(t, os.WriteFile(certFile, c, 0o600))
		require.NoError(t, os.WriteFile(keyFile, k, 0o600))
	}
	write(rogue)

	ob := openTest(t, Options{})
	commitOrder(t, ob, "pos/orders", 1)
	pub, err := NewMQTTPublisher(MQTTOptions{Broker: b.URL(),
		TLSFiles: &TLSFiles{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}, ConnectTimeout: 2 * time.Second, Protocol: proto, Logger: testLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { pub.Close() })
	opts := fastRelay()
	opts.Reconnect = Backoff{Initial: time.Hour, Max: time.Hour} // only ReconnectNow retries
	r, err := ob.NewRelay(pub, opts)
	require.NoError(t, err)
	startRelay(t, r)
	var last string
	eventually(t, 10*time.Second, "handshake refused", func() bool {
		s, _ := r.Stats(t.Context())
		last = s.LastError
		return last != ""
	})
	require.Contains(t, last, "the broker refused the TLS handshake")
	state, attempts := rowState(t, ob, 1)
	require.Equal(t, "pending", state)
	require.Zero(t, attempts)

	write(ca) // the certificate is renewed on disk
	r.ReconnectNow()
	select {
	case p := <-got:
		ev, err := DecodeEvent(p)
		require.NoError(t, err)
		require.EqualValues(t, 1, ev.Sequence)
	case <-time.After(10 * time.Second):
		t.Fatal("not delivered after the certificate was replaced")
	}
}

func TestTLSFilesChecked(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	require.NoError(t, os.WriteFile(bad, []byte("not pem"), 0o600))
	for _, f := range []TLSFiles{{CAFile: bad}, {CAFile: filepath.Join(dir, "missing.pem")}, {CertFile: bad}, {CertFile: bad, KeyFile: bad}} {
		_, err := NewMQTTPublisher(MQTTOptions{Broker: "ssl://127.0.0.1:8883", TLSFiles: &f})
		require.Error(t, err, "%+v", f)
	}
	_, err := NewMQTTPublisher(MQTTOptions{Broker: "tcp://127.0.0.1:1883", TLSFiles: &TLSFiles{}})
	require.ErrorContains(t, err, "need a TLS URL")
}
