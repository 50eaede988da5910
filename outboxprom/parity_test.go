package outboxprom

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/metrics"
)

// The till's outboxctl writes the outbox's metrics with metrics.WriteText;
// an application's registry gets them from the Exporter. The tests here
// hold the two to the same families and values, so that neither can drift.

// fixed is a Collector of given families, through the Exporter's own
// conversion.
type fixed struct {
	e        *Exporter
	families []metrics.Family
}

func (f fixed) Describe(ch chan<- *prometheus.Desc) { f.e.Describe(ch) }
func (f fixed) Collect(ch chan<- prometheus.Metric) { f.e.collect(ch, f.families) }

// TestTillTextIsTheCollectors reads snapshots covering every branch of the
// table (a relay and none, the pending bytes known and counted in the
// background, the free space unknown, label values to escape, the
// database failing) into families once, and compares what the till writes
// of them with what the Exporter's Collector gives client_golang, parsed
// and encoded again by client_golang's expfmt.
func TestTillTextIsTheCollectors(t *testing.T) {
	now := time.Now()
	rm := outbox.RelayMetrics{
		Connected: true, ConnectionAttempts: 3, Disconnected: 1500 * time.Millisecond, Published: 41, DeadLettered: 2,
		AttemptsCharged: 5, InFlight: 7, HoldsLease: true, LastWriteOK: true, Protocol: "5", Source: "/shops/\"9\"\\till\n7",
	}
	for i := range rm.PublishAck.Counts {
		rm.PublishAck.Counts[i] = uint64(10 + i)
		rm.CommitAck.Counts[i] = uint64(i * i)
	}
	rm.PublishAck.Count, rm.PublishAck.Sum = 40, 0.123
	rm.CommitAck.Count, rm.CommitAck.Sum = 500, 98765.4321
	g := outbox.Gauges{Pending: 12, PendingBytes: 3400, PendingBytesKnown: true, OldestPending: now.Add(-93 * time.Second),
		Dead: 2, DatabaseBytes: 1 << 20, WALBytes: 4 << 20, FreeBytes: 1 << 33, FreeBytesKnown: true,
		Priorities: []outbox.PriorityStats{{Priority: 9, Pending: 2, OldestPending: now.Add(-4 * time.Second)}, {Priority: 0, Pending: 10, OldestPending: now.Add(-93 * time.Second)}},
		Commands:   outbox.CommandStats{Waiting: 2, Applied: 140, Expired: 1}}
	unknown := g
	unknown.PendingBytesKnown, unknown.FreeBytesKnown = false, false
	cases := map[string]metrics.Snapshot{
		"relay":    {Now: now, Gauges: g, Relay: &rm, Version: "v1.4.0"},
		"no relay": {Now: now, Gauges: g, Version: "dev"},
		"counted in the background, free space unknown": {Now: now, Gauges: unknown, ScannedPendingBytes: 777, Relay: &rm, Version: "v1.4.0"},
		"nothing pending, not connected":                {Now: now, Gauges: outbox.Gauges{DatabaseBytes: 4096}, Relay: &outbox.RelayMetrics{LastWriteOK: true}, Version: "v"},
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			families := metrics.Outbox(s)
			var text strings.Builder
			require.NoError(t, metrics.WriteText(&text, families))
			require.NoError(t, testutil.CollectAndCompare(fixed{newDescs(s.Relay != nil), families}, strings.NewReader(text.String())),
				"the till's exposition:\n%s", text.String())
			for _, f := range families {
				if len(f.Samples) > 0 {
					require.Contains(t, text.String(), "\n# TYPE "+f.Name+" "+f.Type.String()+"\n")
				}
			}
		})
	}

	t.Run("the database failed", func(t *testing.T) {
		s := cases["relay"]
		s.GaugesErr = errors.New("database is locked")
		families := metrics.Outbox(s)
		var text strings.Builder
		require.NoError(t, metrics.WriteText(&text, families))
		// What could be read is the same on both sides...
		var read []metrics.Family
		var failed []string
		for _, f := range families {
			if f.Err != nil {
				failed = append(failed, f.Name)
				require.NotContains(t, text.String(), f.Name+" ", "the till leaves out what it could not read")
				continue
			}
			read = append(read, f)
		}
		require.Len(t, failed, 10)
		require.NoError(t, testutil.CollectAndCompare(fixed{newDescs(true), read}, strings.NewReader(text.String())))
		// ...and the Collector reports each family it could not read.
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(fixed{newDescs(true), families})
		_, err := reg.Gather()
		require.Error(t, err)
		for _, name := range failed {
			require.Contains(t, err.Error(), fmt.Sprintf("%q", name))
		}
		require.Contains(t, err.Error(), "database is locked")
	})
}

// outboxFamilies are the names of the outbox's metric families.
func outboxFamilies() []string {
	var names []string
	for _, f := range metrics.Definitions(true) {
		names = append(names, f.Name)
	}
	return names
}

// TestTillServesWhatTheExporterServes scrapes the two /metrics of one
// relay, the exporter's and the till's, once the relay is idle, and
// compares their outbox families.
func TestTillServesWhatTheExporterServes(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.commit(t, 9)
	harness.Eventually(t, 10*time.Second, "nine published and marked", func() bool {
		m := r.relay.Metrics()
		return m.Published == 9 && m.InFlight == 0 && m.Connected
	})
	// The database's and its file system's sizes move with the relay's
	// lease renewals and with other programs: scraped at the same moment,
	// the two agree.
	var last error
	ok := harness.WaitFor(10*time.Second, func() bool {
		_, till := fetch(t, r.till, "/metrics")
		last = testutil.ScrapeAndCompare(r.srv.URL+"/metrics", strings.NewReader(till), outboxFamilies()...)
		return last == nil
	})
	require.True(t, ok, "the till's /metrics differs from the exporter's: %v", last)
	_, till := fetch(t, r.till, "/metrics")
	require.Equal(t, "9", metricValue(t, till, "outbox_published_total"))
}

// TestTillRuntimeFamiliesAreClientGolangs: each Go runtime's and process's
// family the till writes by hand, and promhttp's errors counter, is one
// that client_golang exposes under the same name, help and type; those
// that cannot move between two scrapes have the same value.
func TestTillRuntimeFamiliesAreClientGolangs(t *testing.T) {
	r := startRig(t, rigOptions{})
	_, prom := r.get(t, "/metrics")
	_, till := fetch(t, r.till, "/metrics")
	promLines := map[string]bool{}
	for line := range strings.Lines(prom) {
		promLines[line] = true
	}
	var families []string
	for line := range strings.Lines(till) {
		if strings.HasPrefix(line, "outbox_") || strings.HasPrefix(line, "# HELP outbox_") || strings.HasPrefix(line, "# TYPE outbox_") {
			continue
		}
		if strings.HasPrefix(line, "# ") {
			require.True(t, promLines[line], "client_golang's collectors have no line %q", line)
			if strings.HasPrefix(line, "# TYPE ") {
				families = append(families, strings.Fields(line)[2])
			}
			continue
		}
		name := strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '{' })[0]
		switch name {
		case "go_info", "go_gc_gogc_percent", "go_gc_gomemlimit_bytes", "go_sched_gomaxprocs_threads",
			"process_start_time_seconds", "process_max_fds", "process_virtual_memory_max_bytes", "promhttp_metric_handler_errors_total":
			require.True(t, promLines[line], "client_golang's collectors have not %q", line)
		}
	}
	require.Len(t, families, 16, "the till's go_*, process_* and promhttp_* families: %v", families)
	t.Logf("the till's go_* and process_* families: %v", families)
}
