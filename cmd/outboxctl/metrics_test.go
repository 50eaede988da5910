package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestRelayMetricsListen runs outboxctl relay --metrics-listen with an admin
// token and reads /healthz, /readyz, /metrics and the status page from it.
func TestRelayMetricsListen(t *testing.T) {
	b := startBroker(t)
	path := filepath.Join(t.TempDir(), "shop.db")
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("0123456789abcdef\n"), 0o600))
	port, err := harness.FreePort()
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(binary, "relay", "--db", path, "--broker", "tcp://"+b.addr, "--client-id", "metrics-test",
		"--source", "/shops/9", "--metrics-listen", addr, "--admin-token-file", tokenFile)
	var stderr harness.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	get := func(p string) (int, string) {
		resp, err := http.Get("http://" + addr + p)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	harness.Eventually(t, 15*time.Second, "ready", func() bool {
		code, _ := get("/readyz")
		return code == http.StatusOK
	})
	code, _ := get("/healthz")
	require.Equal(t, http.StatusOK, code)
	harness.Eventually(t, 10*time.Second, "connected, as /metrics says", func() bool {
		_, text := get("/metrics")
		return strings.Contains(text, "\noutbox_connected 1\n")
	})
	_, text := get("/metrics")
	require.Contains(t, text, `outbox_info{mqtt_version="5",source="/shops/9",version="dev"} 1`)
	require.Contains(t, text, "go_goroutines")
	code, page := get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, "Connected to the broker")
	require.NotContains(t, page, "0123456789abcdef", "the token is never shown")

	stopRelay(t, cmd, &stderr)
	require.NotContains(t, stderr.String(), "0123456789abcdef", "the token is never logged")
}

// TestRelayMetricsFlags: the token file needs the listener, and a token.
func TestRelayMetricsFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "never.db")
	short := filepath.Join(t.TempDir(), "short")
	require.NoError(t, os.WriteFile(short, []byte("abc\n"), 0o600))
	for _, args := range [][]string{
		{"--admin-token-file", short},
		{"--metrics-listen", "127.0.0.1:0", "--admin-token-file", short},
		{"--metrics-listen", "127.0.0.1:0", "--admin-token-file", "/nonexistent"},
	} {
		r := ctl(t, append([]string{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1"}, args...)...)
		require.Equal(t, 2, r.Code, "%v: %s", args, r.Stderr)
		require.Contains(t, r.Stderr, "--admin-token-file")
	}
	_, err := os.Stat(path)
	require.True(t, os.IsNotExist(err), "nothing written")
}
