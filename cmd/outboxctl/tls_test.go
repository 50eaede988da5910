package main

import (
	"crypto/tls"
	"database/sql"
	"io"
	"log/slog"
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

	"github.com/edgeoutbox/outbox/internal/harness"
)

func TestRelayTLS(t *testing.T) {
	dir := t.TempDir()
	good, other := harness.NewCA(t, "good-ca"), harness.NewCA(t, "other-ca")
	caPath, otherCA := filepath.Join(dir, "good-ca.pem"), filepath.Join(dir, "other-ca.pem")
	require.NoError(t, os.WriteFile(caPath, good.PEM, 0o600))
	require.NoError(t, os.WriteFile(otherCA, other.PEM, 0o600))
	srvCert := good.ServerCertificate(t)

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
