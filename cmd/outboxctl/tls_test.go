package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// testCA makes a CA and a server certificate for 127.0.0.1.
func testCA(t *testing.T, dir, name string) (caPath string, server tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "broker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	require.NoError(t, err)
	caPath = filepath.Join(dir, name+".pem")
	require.NoError(t, os.WriteFile(caPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))
	return caPath, tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}
}

func TestRelayTLS(t *testing.T) {
	dir := t.TempDir()
	caPath, srvCert := testCA(t, dir, "good-ca")
	otherCA, _ := testCA(t, dir, "other-ca")

	srv := mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, srv.AddHook(new(auth.AllowHook), nil))
	l := listeners.NewTCP(listeners.Config{ID: "tls", Address: "127.0.0.1:0",
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{srvCert}, MinVersion: tls.VersionTLS12}})
	require.NoError(t, srv.AddListener(l))
	require.NoError(t, srv.Serve())
	t.Cleanup(func() { srv.Close() })
	delivered := make(chan string, 10)
	require.NoError(t, srv.Subscribe("shop/#", 1, func(_ *mochi.Client, _ packets.Subscription, pk packets.Packet) {
		delivered <- string(pk.Payload)
	}))

	db := filepath.Join(dir, "shop.db")
	require.Equal(t, 0, ctl(t, "init", "--db", db).code)
	conn, err := sql.Open("sqlite", db)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Exec(`INSERT INTO outbox (topic, payload) VALUES ('shop/1', '{"tls":true}')`)
	require.NoError(t, err)

	run := func(ca string) (*exec.Cmd, *syncBuffer) {
		cmd := exec.Command(binary, "relay", "--db", db, "--broker", "ssl://"+l.Address(), "--ca-file", ca, "--backoff-max", "200ms")
		var logs syncBuffer
		cmd.Stderr = &logs
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, &logs
	}
	stop := func(cmd *exec.Cmd) {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, cmd.Wait())
	}

	// The wrong CA: the broker is not trusted, nothing is sent, the
	// message waits.
	cmd, logs := run(otherCA)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "certificate signed by unknown authority") {
		require.True(t, time.Now().Before(deadline), "no TLS error logged: %s", logs.String())
		time.Sleep(5 * time.Millisecond)
	}
	stop(cmd)
	require.Empty(t, delivered)

	// The right CA: delivered.
	cmd, logs = run(caPath)
	select {
	case p := <-delivered:
		require.Contains(t, p, `"data":{"tls":true}`)
	case <-time.After(10 * time.Second):
		t.Fatalf("not delivered over TLS: %s", logs.String())
	}
	stop(cmd)
}
