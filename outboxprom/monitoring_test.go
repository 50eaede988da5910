package outboxprom

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestAlertRules checks monitoring/alerts.yml with promtool and runs its
// unit tests (monitoring/alerts_test.yml).
func TestAlertRules(t *testing.T) {
	promtool := harness.PromtoolBinary()
	if promtool == "" {
		t.Skip("promtool is not installed (Debian's prometheus package): the rules were not checked")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "monitoring"
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
	// Every metric the rules name is one the exporter registers.
	b, err := os.ReadFile("monitoring/alerts.yml")
	require.NoError(t, err)
	checkNames(t, "alerts.yml", string(b))
}

// registered returns the names of the series the exporter can expose, a
// histogram's _bucket, _sum and _count included.
func registered() map[string]bool {
	names := map[string]bool{}
	ch := make(chan *prometheus.Desc, 64)
	go func() { newDescs(true).Describe(ch); close(ch) }()
	re := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		name := re.FindStringSubmatch(d.String())[1]
		names[name] = true
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			names[name+s] = true
		}
	}
	return names
}

var metricRef = regexp.MustCompile(`\boutbox_[a-z_]+`)

// checkNames fails if text names an outbox_ metric the exporter does not
// register, and returns how many it names.
func checkNames(t *testing.T, what, text string) int {
	t.Helper()
	names := registered()
	refs := metricRef.FindAllString(text, -1)
	for _, ref := range refs {
		require.True(t, names[ref], "%s names %s, which the exporter does not register", what, ref)
	}
	return len(refs)
}

// TestDashboardQueries checks that every query of monitoring/dashboard.json
// names at least one metric and only metrics the exporter registers.
func TestDashboardQueries(t *testing.T) {
	b, err := os.ReadFile("monitoring/dashboard.json")
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	require.NotEmpty(t, d.Panels)
	queries := 0
	for _, p := range d.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, q := range p.Targets {
			require.Positive(t, checkNames(t, "panel "+p.Title, q.Expr), "panel %q: query %q names no outbox metric", p.Title, q.Expr)
			queries++
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			s, _ := q["query"].(string)
			require.Positive(t, checkNames(t, "variable "+v.Name, s), "variable %s names no outbox metric", v.Name)
		}
	}
	t.Logf("%d panels, %d queries", len(d.Panels), queries)
}
