package metrics

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestWriteText writes each kind of family and sample the format has and
// compares it with the exposition written out by hand.
func TestWriteText(t *testing.T) {
	families := []Family{
		{Name: "a_total", Help: "Help with a \\ backslash,\na line feed and \"quotes\".", Type: Counter,
			Labels: []string{"k", "z"}, Samples: []Sample{
				{LabelValues: []string{`quote " backslash \ lf` + "\n" + `end`, "ü"}, Value: 3},
				{LabelValues: []string{"", "x"}, Value: 1e21},
			}},
		{Name: "b", Help: "Gauge.", Type: Gauge, Samples: []Sample{{Value: 0.1}}},
		{Name: "c", Help: "Special values.", Type: Gauge, Labels: []string{"v"}, Samples: []Sample{
			{LabelValues: []string{"nan"}, Value: math.NaN()},
			{LabelValues: []string{"inf"}, Value: math.Inf(1)},
			{LabelValues: []string{"-inf"}, Value: math.Inf(-1)},
			{LabelValues: []string{"neg"}, Value: -2.5},
		}},
		{Name: "none", Help: "No samples: left out.", Type: Gauge},
		{Name: "failed", Help: "Could not be read: left out.", Type: Gauge, Err: errors.New("disk on fire")},
		{Name: "h_seconds", Help: "Histogram.", Type: Histogram, Samples: []Sample{
			{Hist: &HistogramValue{Bounds: []float64{0.0005, 1, 86400}, Counts: []uint64{1, 3, 3}, Count: 4, Sum: 86401.25}},
		}},
		{Name: "hl_seconds", Help: "Labelled histogram.", Type: Histogram, Labels: []string{"op"}, Samples: []Sample{
			{LabelValues: []string{"put"}, Hist: &HistogramValue{Bounds: []float64{1}, Counts: []uint64{0}}},
		}},
	}
	var b strings.Builder
	require.NoError(t, WriteText(&b, families))
	require.Equal(t, `# HELP a_total Help with a \\ backslash,\na line feed and "quotes".
# TYPE a_total counter
a_total{k="quote \" backslash \\ lf\nend",z="ü"} 3
a_total{k="",z="x"} 1e+21
# HELP b Gauge.
# TYPE b gauge
b 0.1
# HELP c Special values.
# TYPE c gauge
c{v="nan"} NaN
c{v="inf"} +Inf
c{v="-inf"} -Inf
c{v="neg"} -2.5
# HELP h_seconds Histogram.
# TYPE h_seconds histogram
h_seconds_bucket{le="0.0005"} 1
h_seconds_bucket{le="1"} 3
h_seconds_bucket{le="86400"} 3
h_seconds_bucket{le="+Inf"} 4
h_seconds_sum 86401.25
h_seconds_count 4
# HELP hl_seconds Labelled histogram.
# TYPE hl_seconds histogram
hl_seconds_bucket{op="put",le="1"} 0
hl_seconds_bucket{op="put",le="+Inf"} 0
hl_seconds_sum{op="put"} 0
hl_seconds_count{op="put"} 0
`, b.String())
}

// TestExpositionPassesPromtool: what the till serves — every outbox family,
// the runtime's and the process's — is what promtool check metrics finds
// nothing to say about.
func TestExpositionPassesPromtool(t *testing.T) {
	rm := outbox.RelayMetrics{Connected: true, Published: 7, Protocol: "5", Source: `/shops/"9"`}
	rm.PublishAck.Counts[3], rm.PublishAck.Count, rm.PublishAck.Sum = 7, 7, 0.021
	s := Snapshot{Now: time.Now(), Version: "v1.2.3", Relay: &rm,
		Gauges: outbox.Gauges{Pending: 3, OldestPending: time.Now().Add(-time.Minute), FreeBytes: 1 << 30, FreeBytesKnown: true,
			Priorities: []outbox.PriorityStats{{Priority: 9, Pending: 1, OldestPending: time.Now()}, {Priority: 0, Pending: 2, OldestPending: time.Now().Add(-time.Minute)}}}}
	h := Handler(slog.Default(), func(context.Context) []Family { return Outbox(s) }, Runtime, Process)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, ContentType, rec.Header().Get("Content-Type"))
	text := rec.Body.String()
	for _, name := range []string{"outbox_commit_ack_seconds", "outbox_filesystem_free_bytes", "outbox_priority_pending_messages", "go_goroutines", "process_start_time_seconds"} {
		require.Contains(t, text, "# TYPE "+name+" ")
	}
	harness.LintMetrics(t, text)
}
