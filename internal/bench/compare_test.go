package bench

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// storedDir holds the runs kept as outboxlab bench --json wrote them.
const storedDir = "../../docs/bench"

func loadStored(t *testing.T, names ...string) []*StoredReport {
	t.Helper()
	var out []*StoredReport
	for _, n := range names {
		r, err := LoadReport(filepath.Join(storedDir, n+".json"))
		require.NoError(t, err)
		out = append(out, r)
	}
	return out
}

// TestCompareStoredRuns compares issue 31's stored runs and finds the
// figures BENCHMARKS.md gives for them: the relay's drain at mochi, window
// 16, MQTT 3.1.1 rose by 1.16 (the means of two runs a side).
func TestCompareStoredRuns(t *testing.T) {
	var out bytes.Buffer
	before := loadStored(t, "2026-12-04-before-1", "2026-12-04-before-2")
	after := loadStored(t, "2026-12-04-after-1", "2026-12-04-after-2")
	require.NoError(t, Compare(&out, before, after))
	md := out.String()
	require.Contains(t, md, "| A | 2026-12-04-before-2.json | 2026-12-04T15:49:00Z | full | 2.56 2.60 2.34; 2.66 2.80 2.54 |")
	require.Contains(t, md, "| `drain_mochi_w16_library_msgs_per_s` | msg/s | 51,059, 56,648 | 62,614, 61,934 | 1.16 |")
	require.Contains(t, md, "| `drain_mosquitto_w1_library_msgs_per_s` | msg/s | 8,186, 6,897 | 8,365, 6,608 | 0.99 |")
	require.Contains(t, md, "| `drain_mochi_order_held` | bool | yes, yes | yes, yes |  |")
	require.Contains(t, md, "## 3. Latency online")
	require.NotContains(t, md, "## 6. Size", "section 6 did not run")
	require.NotContains(t, md, "Not one machine")

	// One run a side.
	out.Reset()
	require.NoError(t, Compare(&out, loadStored(t, "2026-12-04-before-1"), loadStored(t, "2026-12-04-after-1")))
	require.Contains(t, out.String(), "| `enqueue_full_library_vs_raw` | ratio | 1.01 | 1.01 | 1.00 |")
	require.Contains(t, out.String(), "| `enqueue_full_added_us` | µs |")

	// Only what both sides measured: section 3 alone against sections 1–3.
	out.Reset()
	require.NoError(t, Compare(&out, before, loadStored(t, "2026-12-04-s3-after-1")))
	require.NotContains(t, out.String(), "## 1.")
	require.Contains(t, out.String(), "`latency_library_mochi_puback_p99_ms`")
}

func TestCompareSaysWhenMachinesDiffer(t *testing.T) {
	a := loadStored(t, "2026-12-04-before-1")
	b := loadStored(t, "2026-12-04-after-1")
	b[0].Meta.NumCPU = 8
	var out bytes.Buffer
	require.NoError(t, Compare(&out, a, b))
	require.Contains(t, out.String(), "Not one machine")
	require.Error(t, Compare(&out, nil, b))
}

func TestParseReportRefusesWhatIsNotAReport(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"not JSON", "| key | A |", "not a bench report"},
		{"not an object", "[1, 2]", "not a bench report"},
		{"no date", `{"mode": "full", "x": 1}`, "no date or mode"},
		{"meta of the wrong type", `{"mode": "full", "date": "d", "nproc": "two"}`, "meta"},
		{"a figure that is an object", `{"mode": "full", "date": "d", "drain_mochi_w1_ratio": {"a": 1}}`, "drain_mochi_w1_ratio"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseReport("x.json", []byte(tc.in))
			require.ErrorContains(t, err, tc.want)
		})
	}
	r, err := ParseReport("x.json", []byte(`{"mode": "quick", "date": "d", "targets": [], "notes": {}, "drain_mochi_w1_ratio": 0.9, "drain_mochi_order_held": null}`))
	require.NoError(t, err)
	require.Equal(t, map[string]any{"drain_mochi_w1_ratio": 0.9, "drain_mochi_order_held": nil}, r.Figures)
}

// TestStoredReports: every run kept in docs/bench is a report that compares:
// named for its date, parsed, and with no key that this binary does not
// document (keys are added, never renamed or removed), and each section it
// ran measured something.
func TestStoredReports(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(storedDir, "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	documented := map[string]int{}
	for _, k := range keys {
		documented[k.key] = k.section
	}
	name := regexp.MustCompile(`^(\d{4}-\d{2}-\d{2})-[a-z0-9]+(-[a-z0-9]+)*\.json$`)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			m := name.FindStringSubmatch(filepath.Base(f))
			require.NotNil(t, m, "named YYYY-MM-DD-label.json")
			r, err := LoadReport(f)
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(r.Meta.Date, m[1]), "named for its date, %s", r.Meta.Date)
			require.Contains(t, []string{string(Quick), string(Full), string(Smoke)}, r.Meta.Mode)
			require.NotEmpty(t, r.Meta.GoVersion)
			require.NotZero(t, r.Meta.NumCPU)
			for k := range r.Figures {
				_, ok := documented[k]
				require.True(t, ok, "%s is not documented (outboxlab bench --keys)", k)
			}
			require.NotEmpty(t, r.Meta.SectionSeconds)
			for s := range r.Meta.SectionSeconds {
				n, err := strconv.Atoi(s)
				require.NoError(t, err)
				measured := 0
				for k, v := range r.Figures {
					if documented[k] == n && v != nil {
						measured++
					}
				}
				require.Positive(t, measured, "section %d ran", n)
			}
		})
	}
}
