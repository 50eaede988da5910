package outboxprom

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestPrometheusThroughOutage has a real Prometheus scrape the exporter
// every 200 ms while the broker goes away, messages are committed, and the
// broker comes back; then it asks Prometheus what it saw: the backlog rising
// to what was committed and draining to 0, outbox_connected going 0 then 1,
// outbox_published_total equal to what was committed.
func TestPrometheusThroughOutage(t *testing.T) {
	if harness.PrometheusBinary() == "" {
		t.Skip("prometheus is not installed: apt-get install -y prometheus")
	}
	r := startRig(t, rigOptions{})
	prom := harness.StartPrometheus(t, harness.PrometheusOptions{Targets: []string{strings.TrimPrefix(r.srv.URL, "http://")}})
	// seen waits until Prometheus' latest sample of query is want.
	seen := func(what, query string, want float64) {
		t.Helper()
		var last float64
		var lastErr error
		ok := harness.WaitFor(20*time.Second, func() bool {
			v, ok, err := prom.Value(query)
			last, lastErr = v, err
			return ok && err == nil && v == want
		})
		require.True(t, ok, "Prometheus never saw %s (%s = %v), last %v, err %v", what, query, want, last, lastErr)
	}
	seen("the relay connected", "outbox_connected", 1)
	seen("the target up", `up{job="outbox"}`, 1)

	const n = 40
	r.proxy.Down()
	seen("the relay disconnected", "outbox_connected", 0)
	r.commit(t, n)
	seen("the backlog", "outbox_pending_messages", n)
	require.NoError(t, r.proxy.Up())
	seen("the backlog drained", "outbox_pending_messages", 0)
	seen("the relay connected again", "outbox_connected", 1)
	seen("every committed message published", "outbox_published_total", n)

	// What Prometheus kept of the outage.
	v, ok, err := prom.Value("max_over_time(outbox_pending_messages[10m])")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, float64(n), v, "the highest backlog Prometheus saw")
	v, _, err = prom.Value("min_over_time(outbox_connected[10m])")
	require.NoError(t, err)
	require.Equal(t, 0.0, v, "Prometheus saw the relay disconnected")
	v, _, err = prom.Value("outbox_disconnected_seconds_total")
	require.NoError(t, err)
	require.Positive(t, v)
	v, _, err = prom.Value("outbox_connection_attempts_total")
	require.NoError(t, err)
	require.GreaterOrEqual(t, v, 2.0)
	v, _, err = prom.Value("outbox_commit_ack_seconds_count")
	require.NoError(t, err)
	require.Equal(t, float64(n), v)
	v, _, err = prom.Value("outbox_dead_messages")
	require.NoError(t, err)
	require.Equal(t, 0.0, v)
	// For the log: what the scrapes cost, seen from Prometheus. Not
	// asserted: under -race on a loaded runner a scrape can pass the 200 ms
	// timeout (BenchmarkScrape100k measures the cost).
	med, _, err := prom.Value(`quantile_over_time(0.5, scrape_duration_seconds{job="outbox"}[10m])`)
	require.NoError(t, err)
	longest, _, err := prom.Value(`max_over_time(scrape_duration_seconds{job="outbox"}[10m])`)
	require.NoError(t, err)
	failed, _, err := prom.Value(`count_over_time((up{job="outbox"} == 0)[10m:])`)
	require.NoError(t, err)
	total, _, err := prom.Value(`count_over_time(up{job="outbox"}[10m])`)
	require.NoError(t, err)
	t.Logf("scrapes: %.0f, %.0f timed out; median %.1f ms, longest %.1f ms", total, failed, med*1000, longest*1000)
}
