package main

import (
	"crypto/tls"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

func TestRelayTLS(t *testing.T) {
	dir := t.TempDir()
	good, other := harness.NewCA(t, "good-ca"), harness.NewCA(t, "other-ca")
	caPath, otherCA := filepath.Join(dir, "good-ca.pem"), filepath.Join(dir, "other-ca.pem")
	require.NoError(t, os.WriteFile(caPath, good.PEM, 0o600))
	require.NoError(t, os.WriteFile(otherCA, other.PEM, 0o600))

	b := harness.StartMochi(t, harness.MochiOptions{
		TLS: &tls.Config{Certificates: []tls.Certificate{good.ServerCertificate(t)}, MinVersion: tls.VersionTLS12}})
	delivered := make(chan string, 10)
	require.NoError(t, b.Subscribe("shop/#", func(m harness.Message) { delivered <- string(m.Payload) }))

	db := filepath.Join(dir, "shop.db")
	require.Equal(t, 0, ctl(t, "init", "--db", db).Code)
	conn, err := sql.Open("sqlite", db)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Exec(`INSERT INTO outbox (topic, payload) VALUES ('shop/1', '{"tls":true}')`)
	require.NoError(t, err)

	run := func(ca string) (*exec.Cmd, *harness.LogBuffer) {
		cmd := exec.Command(binary, "relay", "--db", db, "--broker", b.URL(), "--ca-file", ca, "--backoff-max", "200ms")
		var logs harness.LogBuffer
		cmd.Stderr = &logs
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, &logs
	}

	// The wrong CA: the broker is not trusted, nothing is sent, the
	// message waits.
	cmd, logs := run(otherCA)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "certificate signed by unknown authority") {
		require.True(t, time.Now().Before(deadline), "no TLS error logged: %s", logs.String())
		time.Sleep(5 * time.Millisecond)
	}
	stopRelay(t, cmd, logs)
	require.Empty(t, delivered)

	// The right CA: delivered.
	cmd, logs = run(caPath)
	select {
	case p := <-delivered:
		require.Contains(t, p, `"data":{"tls":true}`)
	case <-time.After(10 * time.Second):
		t.Fatalf("not delivered over TLS: %s", logs.String())
	}
	stopRelay(t, cmd, logs)
}
