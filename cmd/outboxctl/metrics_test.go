package main

import (
	"debug/buildinfo"
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

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestRelayMetricsListen runs outboxctl relay --metrics-listen with an admin
// token and reads /healthz, /readyz, /metrics and the status page from it;
// promtool lints /metrics and a real Prometheus scrapes it.
func TestRelayMetricsListen(t *testing.T) {
	b := startBroker(t)
	path, ob := newOutbox(t)
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
	enqueue(t, ob, outbox.Message{Topic: "shop/9/sales", Payload: []byte(`{"n":1}`)}, outbox.Message{Topic: "shop/9/sales", Payload: []byte(`{"n":2}`)})
	harness.Eventually(t, 10*time.Second, "two published, as /metrics says", func() bool {
		_, text := get("/metrics")
		return strings.Contains(text, "\noutbox_published_total 2\n") && strings.Contains(text, "\noutbox_commit_ack_seconds_count 2\n")
	})
	_, text := get("/metrics")
	require.Contains(t, text, `outbox_info{protocol="MQTT 5",source="/shops/9",version="dev"} 1`)
	for _, family := range []string{"outbox_pending_messages gauge", "outbox_publish_ack_seconds histogram", "outbox_connection_attempts_total counter",
		"go_goroutines gauge", "process_resident_memory_bytes gauge", "process_start_time_seconds gauge"} {
		require.Contains(t, text, "\n# TYPE "+family+"\n")
	}
	code, page := get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, "Connected to the broker")
	require.NotContains(t, page, "0123456789abcdef", "the token is never shown")

	t.Run("promtool", func(t *testing.T) { harness.LintMetrics(t, text) })
	t.Run("prometheus", func(t *testing.T) {
		prom := harness.StartPrometheus(t, harness.PrometheusOptions{Targets: []string{addr}})
		for query, want := range map[string]float64{
			`up{job="outbox"}`: 1, "outbox_connected": 1, "outbox_published_total": 2, "outbox_commit_ack_seconds_count": 2,
			`outbox_info{source="/shops/9"}`: 1, "outbox_pending_messages": 0,
		} {
			var got float64
			var err error
			ok := harness.WaitFor(20*time.Second, func() bool {
				var ok bool
				got, ok, err = prom.Value(query)
				return ok && err == nil && got == want
			})
			require.True(t, ok, "Prometheus never saw %s = %v: last %v, %v", query, want, got, err)
		}
		start, ok, err := prom.Value("process_start_time_seconds")
		require.NoError(t, err)
		require.True(t, ok)
		require.WithinDuration(t, time.Now(), time.Unix(int64(start), 0), 5*time.Minute)
	})

	stopRelay(t, cmd, &stderr)
	require.NotContains(t, stderr.String(), "0123456789abcdef", "the token is never logged")
}

// TestTillLinksNoPrometheusClient: the till serves its metrics without
// Prometheus's client, whose data model and registry would cost it about
// 2 MB (BENCHMARKS.md, section 6). The build information lists every module
// the binary links.
func TestTillLinksNoPrometheusClient(t *testing.T) {
	bi, err := buildinfo.ReadFile(binary)
	require.NoError(t, err)
	var linked []string
	for _, d := range bi.Deps {
		linked = append(linked, d.Path)
		for _, heavy := range []string{"github.com/prometheus/", "google.golang.org/protobuf"} {
			require.False(t, strings.HasPrefix(d.Path, heavy), "outboxctl links %s", d.Path)
		}
	}
	require.Contains(t, linked, "modernc.org/sqlite", "the build information lists the modules linked")
}
