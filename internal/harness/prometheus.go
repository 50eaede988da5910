package harness

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// PrometheusBinary finds the prometheus executable (Debian's prometheus
// package); "" if it is not installed.
func PrometheusBinary() string { return findBinary("prometheus") }

// PromtoolBinary finds promtool, which comes with Debian's prometheus
// package; "" if it is not installed.
func PromtoolBinary() string { return findBinary("promtool") }

func findBinary(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/bin", "/usr/sbin", "/usr/local/bin"} {
		if p := filepath.Join(dir, name); executable(p) {
			return p
		}
	}
	return ""
}

// LintMetrics has promtool check metrics read an exposition in the text
// format and fails tb if promtool has anything to say about it; it skips
// tb if promtool is not installed.
func LintMetrics(tb TB, text string) {
	tb.Helper()
	promtool := PromtoolBinary()
	if promtool == "" {
		tb.Skipf("promtool is not installed (Debian's prometheus package): the exposition was not linted")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		tb.Fatalf("promtool check metrics: %v\n%s\nof:\n%s", err, out, text)
	}
}

// Prometheus is a Prometheus server owned by a test: its own configuration
// and data directory in the test's directory, a loopback port of its own,
// stopped by PID when the test ends.
type Prometheus struct {
	URL string // http://host:port
}

// PrometheusOptions shape a Prometheus.
type PrometheusOptions struct {
	// Targets are the host:port pairs scraped at /metrics.
	Targets []string
	// ScrapeInterval is how often they are scraped. Default 200 ms.
	ScrapeInterval time.Duration
	// RuleFiles are alerting or recording rules to load.
	RuleFiles []string
}

// StartPrometheus starts a Prometheus that lives as long as tb and scrapes
// the targets, skipping tb if prometheus is not installed. It waits until
// the server says it is ready.
func StartPrometheus(tb TB, o PrometheusOptions) *Prometheus {
	tb.Helper()
	bin := PrometheusBinary()
	if bin == "" {
		tb.Skipf("prometheus is not installed: apt-get install -y prometheus")
	}
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = 200 * time.Millisecond
	}
	dir := tb.TempDir()
	conf := filepath.Join(dir, "prometheus.yml")
	var b strings.Builder
	fmt.Fprintf(&b, "global:\n  scrape_interval: %dms\n  scrape_timeout: %dms\n  evaluation_interval: %dms\n",
		o.ScrapeInterval.Milliseconds(), o.ScrapeInterval.Milliseconds(), o.ScrapeInterval.Milliseconds())
	if len(o.RuleFiles) > 0 {
		b.WriteString("rule_files:\n")
		for _, f := range o.RuleFiles {
			fmt.Fprintf(&b, "  - %q\n", f)
		}
	}
	b.WriteString("scrape_configs:\n  - job_name: outbox\n    static_configs:\n      - targets: [")
	for i, t := range o.Targets {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(t))
	}
	b.WriteString("]\n")
	must(tb, os.WriteFile(conf, []byte(b.String()), 0o600), "prometheus.yml")
	port := freePorts(tb, 1)[0]
	p := &Prometheus{URL: "http://" + loopback(port)}
	proc := startProcess(tb, "prometheus", filepath.Join(dir, "prometheus.log"), dir, nil, 10*time.Second, bin,
		"--config.file="+conf,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+loopback(port),
		"--log.level=warn")
	proc.waitReady(tb, 30*time.Second, func([]byte) bool {
		resp, err := http.Get(p.URL + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// PromSample is one series of an instant query's result.
type PromSample struct {
	Labels map[string]string
	Value  float64
}

// Query runs an instant query (PromQL) now and returns its vector.
func (p *Prometheus) Query(query string) ([]PromSample, error) {
	resp, err := http.Get(p.URL + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("prometheus query %q: %w", query, err)
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("prometheus query %q: %s", query, out.Error)
	}
	var res []PromSample
	for _, r := range out.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("prometheus query %q: value %q: %w", query, s, err)
		}
		res = append(res, PromSample{Labels: r.Metric, Value: v})
	}
	return res, nil
}

// Value runs an instant query that should give one series and returns its
// value; ok is false when it gives none.
func (p *Prometheus) Value(query string) (v float64, ok bool, err error) {
	res, err := p.Query(query)
	if err != nil || len(res) == 0 {
		return 0, false, err
	}
	if len(res) > 1 {
		return 0, false, fmt.Errorf("prometheus query %q: %d series, want one", query, len(res))
	}
	return res[0].Value, true, nil
}
