package outboxprom

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestPrometheusThroughOutage has a real Prometheus scrape the exporter,
// and the till's /metrics of the same relay (written without Prometheus's
// client), every 200 ms while the broker goes away, messages are
// committed, and the broker comes back; then it asks Prometheus what it saw
// through each: the backlog rising to what was committed and draining to 0,
// outbox_connected going 0 then 1, outbox_published_total equal to what was
// committed.
func TestPrometheusThroughOutage(t *testing.T) {
	if harness.PrometheusBinary() == "" {
		t.Skip("prometheus is not installed: apt-get install -y prometheus")
	}
	r := startRig(t, rigOptions{})
	targets := map[string]string{ // instance → what serves it
		strings.TrimPrefix(r.srv.URL, "http://"):  "outboxprom",
		strings.TrimPrefix(r.till.URL, "http://"): "till",
	}
	var hosts []string
	for host := range targets {
		hosts = append(hosts, host)
	}
	prom := harness.StartPrometheus(t, harness.PrometheusOptions{Targets: hosts})
	// values runs query and returns its value through each target, by
	// what serves it; an error unless both gave one.
	values := func(query string) (map[string]float64, error) {
		res, err := prom.Query(query)
		if err != nil {
			return nil, err
		}
		out := map[string]float64{}
		for _, s := range res {
			out[targets[s.Labels["instance"]]] = s.Value
		}
		if len(res) != len(targets) || len(out) != len(targets) {
			return out, fmt.Errorf("%s: %d series, want one per target (%v)", query, len(res), res)
		}
		return out, nil
	}
	// seen waits until Prometheus' latest sample of query is want through
	// both targets.
	seen := func(what, query string, want float64) {
		t.Helper()
		var last map[string]float64
		var lastErr error
		ok := harness.WaitFor(20*time.Second, func() bool {
			last, lastErr = values(query)
			return lastErr == nil && last["outboxprom"] == want && last["till"] == want
		})
		require.True(t, ok, "Prometheus never saw %s (%s = %v) through both, last %v, err %v", what, query, want, last, lastErr)
	}
	// both checks a query's value through both targets.
	both := func(query string, check func(v float64) bool) {
		t.Helper()
		vs, err := values(query)
		require.NoError(t, err)
		for target, v := range vs {
			require.True(t, check(v), "%s through %s: %v", query, target, v)
		}
	}
	seen("the relay connected", "outbox_connected", 1)
	seen("the targets up", `up{job="outbox"}`, 1)

	const n = 40
	r.proxy.Down()
	seen("the relay disconnected", "outbox_connected", 0)
	r.commit(t, n)
	seen("the backlog", "outbox_pending_messages", n)
	require.NoError(t, r.proxy.Up())
	seen("the backlog drained", "outbox_pending_messages", 0)
	seen("the relay connected again", "outbox_connected", 1)
	seen("every committed message published", "outbox_published_total", n)
	seen("every acknowledgement timed", "outbox_commit_ack_seconds_count", n)

	// What Prometheus kept of the outage.
	both("max_over_time(outbox_pending_messages[10m])", func(v float64) bool { return v == n })
	both("min_over_time(outbox_connected[10m])", func(v float64) bool { return v == 0 })
	both("outbox_disconnected_seconds_total", func(v float64) bool { return v > 0 })
	both("outbox_connection_attempts_total", func(v float64) bool { return v >= 2 })
	both("outbox_dead_messages", func(v float64) bool { return v == 0 })
	both("histogram_quantile(0.5, outbox_commit_ack_seconds_bucket)", func(v float64) bool { return v > 0 })
	both("process_resident_memory_bytes", func(v float64) bool { return v > 0 })
	// For the log: what the scrapes cost, seen from Prometheus. Not
	// asserted: under -race on a loaded runner a scrape can pass the 200 ms
	// timeout (BenchmarkScrape100k measures the cost).
	logged := func(query string) map[string]float64 {
		vs, err := values(query)
		if err != nil {
			t.Logf("%v", err) // none: count_over_time of no failed scrape
		}
		return vs
	}
	med := logged(`quantile_over_time(0.5, scrape_duration_seconds{job="outbox"}[10m])`)
	longest := logged(`max_over_time(scrape_duration_seconds{job="outbox"}[10m])`)
	failed := logged(`count_over_time((up{job="outbox"} == 0)[10m:])`)
	total := logged(`count_over_time(up{job="outbox"}[10m])`)
	for _, target := range []string{"outboxprom", "till"} {
		t.Logf("%s: scrapes: %.0f, %.0f timed out; median %.1f ms, longest %.1f ms", target, total[target], failed[target], med[target]*1000, longest[target]*1000)
	}
}
