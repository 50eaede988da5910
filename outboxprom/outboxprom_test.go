package outboxprom

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// requiredMetrics are the names issue 16 asks for.
var requiredMetrics = []string{
	"outbox_pending_messages", "outbox_pending_bytes", "outbox_oldest_pending_age_seconds", "outbox_dead_messages",
	"outbox_published_total", "outbox_dead_lettered_total", "outbox_attempts_charged_total", "outbox_connected",
	"outbox_connection_attempts_total", "outbox_disconnected_seconds_total", "outbox_publish_ack_seconds",
	"outbox_commit_ack_seconds", "outbox_database_bytes", "outbox_wal_bytes", "outbox_info",
}

// TestMetricsExposed scrapes /metrics after some traffic, from the
// exporter's Handler and from the till's (the same monitor, written
// without Prometheus's client), and checks the names, the values that
// traffic gives, and that promtool finds nothing to say about either
// exposition.
func TestMetricsExposed(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.commit(t, 7)
	harness.Eventually(t, 10*time.Second, "seven published", func() bool { return r.relay.Metrics().Published == 7 })
	for _, srv := range []struct {
		name string
		*httptest.Server
	}{{"outboxprom", r.srv}, {"till", r.till}} {
		t.Run(srv.name, func(t *testing.T) {
			code, text := fetch(t, srv.Server, "/metrics")
			require.Equal(t, http.StatusOK, code)
			for _, name := range requiredMetrics {
				require.Contains(t, text, "# TYPE "+name+" ", name)
			}
			require.Equal(t, "7", metricValue(t, text, "outbox_published_total"))
			require.Equal(t, "0", metricValue(t, text, "outbox_pending_messages"))
			require.Equal(t, "1", metricValue(t, text, "outbox_connected"))
			require.Equal(t, "7", metricValue(t, text, "outbox_publish_ack_seconds_count"))
			require.Equal(t, "7", metricValue(t, text, "outbox_commit_ack_seconds_count"))
			require.Contains(t, text, `outbox_info{protocol="MQTT 5",source="/test/till-7",version="`)
			require.Contains(t, text, "# TYPE outbox_publish_ack_seconds histogram")
			require.Contains(t, text, "# TYPE outbox_published_total counter")
			require.Contains(t, text, "# TYPE go_goroutines gauge")
			require.Contains(t, text, "# TYPE process_start_time_seconds gauge")

			harness.LintMetrics(t, text)
		})
	}
}

// TestReadyz checks /healthz and /readyz: ready only while the relay runs
// and holds the lease.
func TestReadyz(t *testing.T) {
	r := startRig(t, rigOptions{})
	code, body := r.get(t, "/healthz")
	require.Equal(t, http.StatusOK, code, body)
	harness.Eventually(t, 10*time.Second, "ready", func() bool {
		code, _ := r.get(t, "/readyz")
		return code == http.StatusOK
	})
	r.stop()
	code, body = r.get(t, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "not running")
	code, _ = r.get(t, "/healthz")
	require.Equal(t, http.StatusOK, code)
}

// deadOne parks one message as dead, as the relay would, with a reason.
func deadOne(t *testing.T, ob *outbox.Outbox, reason string) {
	t.Helper()
	_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload, attempts, last_error, dead_at) VALUES ('till-7/refunds', '{}', 5, ?, ?)`,
		reason, time.Now().UnixMilli())
	require.NoError(t, err)
}

// TestRequeueButton checks the status page's requeue: absent without a
// token, refused from another origin or with a wrong token, done with the
// right one from the page's own origin.
func TestRequeueButton(t *testing.T) {
	dead := func(t *testing.T, r *rig) int64 {
		g, err := r.ob.Gauges(context.Background())
		require.NoError(t, err)
		return g.Dead
	}
	t.Run("read-only", func(t *testing.T) {
		r := startRig(t, rigOptions{})
		deadOne(t, r.ob, "the broker said: not authorized")
		_, page := r.get(t, "/")
		require.NotContains(t, page, `action="/requeue"`)
		require.Contains(t, page, "Read-only")
		require.Equal(t, http.StatusForbidden, postForm(t, r, "/requeue", r.srv.URL, "").StatusCode)
		require.Equal(t, int64(1), dead(t, r))
	})
	t.Run("token", func(t *testing.T) {
		r := startRig(t, rigOptions{exporter: Options{AdminToken: "s3cret-token"}})
		deadOne(t, r.ob, "the broker said: not authorized")
		_, page := r.get(t, "/")
		require.Contains(t, page, `action="/requeue"`)
		require.Contains(t, page, "the broker said: not authorized")
		require.Equal(t, http.StatusForbidden, postForm(t, r, "/requeue", "http://evil.example", "s3cret-token").StatusCode, "another site")
		require.Equal(t, http.StatusForbidden, postForm(t, r, "/requeue", "", "s3cret-token").StatusCode, "no origin, no referer")
		resp := postForm(t, r, "/requeue", r.srv.URL, "wrong")
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		require.Equal(t, "/?requeue=denied", resp.Header.Get("Location"))
		require.Equal(t, int64(1), dead(t, r))
		resp = postForm(t, r, "/requeue", r.srv.URL, "s3cret-token")
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		require.Equal(t, "/?requeued=1", resp.Header.Get("Location"))
		require.Equal(t, int64(0), dead(t, r))
		harness.Eventually(t, 10*time.Second, "the requeued message published", func() bool { return r.relay.Metrics().Published == 1 })
	})
}

// postForm posts the status page's form to path on r's listener, from
// origin ("": no Origin header) with token, and returns the answer
// unfollowed.
func postForm(t *testing.T, r *rig, path, origin, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.srv.URL+path, strings.NewReader(url.Values{"token": {token}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

// TestReconnectButton: during an outage the status page says what the
// last error means and what to check, counts this outage's attempts, and
// with the admin token has a "Try to connect now" button that makes a
// relay waiting an hour between attempts try at once: refused from another
// origin or with a wrong token, absent without a token.
func TestReconnectButton(t *testing.T) {
	hour := outbox.Backoff{Initial: time.Hour, Max: time.Hour}
	attempts := regexp.MustCompile(`; (\d+) attempts to connect since then`)
	t.Run("read-only", func(t *testing.T) {
		r := startRig(t, rigOptions{reconnect: hour})
		harness.Eventually(t, 10*time.Second, "connected", func() bool { return r.relay.Metrics().Connected })
		r.proxy.Down()
		harness.Eventually(t, 10*time.Second, "disconnected", func() bool { return !r.relay.Metrics().Connected })
		_, page := r.get(t, "/")
		require.NotContains(t, page, `action="/reconnect"`)
		require.Equal(t, http.StatusForbidden, postForm(t, r, "/reconnect", r.srv.URL, "").StatusCode)
	})
	t.Run("token", func(t *testing.T) {
		r := startRig(t, rigOptions{reconnect: hour, exporter: Options{AdminToken: "s3cret-token"}})
		harness.Eventually(t, 10*time.Second, "connected", func() bool { return r.relay.Metrics().Connected })
		_, page := r.get(t, "/")
		require.NotContains(t, page, `action="/reconnect"`, "connected: nothing to try")
		require.NotContains(t, page, "attempts to connect")
		r.proxy.Down()
		harness.Eventually(t, 10*time.Second, "disconnected", func() bool { return !r.relay.Metrics().Connected })
		_, page = r.get(t, "/")
		require.Contains(t, page, `action="/reconnect"`)
		require.Contains(t, page, "Try to connect now")
		require.Equal(t, []string{"; 0 attempts to connect since then", "0"}, attempts.FindStringSubmatch(page), "the attempt that connected is not this outage's")

		require.Equal(t, http.StatusForbidden, postForm(t, r, "/reconnect", "http://evil.example", "s3cret-token").StatusCode, "another site")
		require.Equal(t, http.StatusForbidden, postForm(t, r, "/reconnect", "", "s3cret-token").StatusCode, "no origin, no referer")
		resp := postForm(t, r, "/reconnect", r.srv.URL, "wrong")
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		require.Equal(t, "/?reconnect=denied", resp.Header.Get("Location"))
		_, page = r.get(t, "/")
		require.Contains(t, page, "; 0 attempts to connect since then", "a wrong token tries nothing")

		// The broker is still away: the attempt fails, and says so in words.
		resp = postForm(t, r, "/reconnect", r.srv.URL, "s3cret-token")
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		require.Equal(t, "/?reconnect=asked", resp.Header.Get("Location"))
		// The attempt is counted as it starts, its error recorded as it ends.
		harness.Eventually(t, 5*time.Second, "an attempt made, and its failure said", func() bool {
			_, page = r.get(t, "/")
			return strings.Contains(page, "; 1 attempts to connect since then") &&
				strings.Contains(page, "Nothing answers at "+r.proxy.Addr()+": the broker is not running there.")
		})
		require.Contains(t, page, "Is the broker running? Is its address right (--broker)?")
		require.Contains(t, page, `<details id="raw-error">`)
		require.Contains(t, page, "connect: connection refused", "the error's own text, one click away")

		require.NoError(t, r.proxy.Up())
		resp = postForm(t, r, "/reconnect", r.srv.URL, "s3cret-token")
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		harness.Eventually(t, 5*time.Second, "connected at once, not in an hour", func() bool { return r.relay.Metrics().Connected })
		_, page = r.get(t, "/?reconnect=asked")
		require.Contains(t, page, "The relay was asked to try to connect now")
		require.Contains(t, page, "Connected to the broker")
		require.Contains(t, page, "This relay is the one that sends this device&#39;s events; its last save to the disk worked.")
	})
}

// BenchmarkScrape100k is one scrape of /metrics at a backlog of 100,000
// pending messages (outbox.BenchmarkStats100k counts them instead: a scrape
// must not).
func BenchmarkScrape100k(b *testing.B) {
	ctx := context.Background()
	ob, err := outbox.Open(ctx, filepath.Join(b.TempDir(), "outbox.db"), outbox.Options{Synchronous: outbox.SyncNormal, ReserveBytes: -1, Logger: harness.TestLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer ob.Close()
	payload := []byte(`{"till":7,"total":1234,"items":[{"sku":"A-1","qty":2},{"sku":"B-22","qty":1}],"at":"2026-01-01T12:00:00Z"}`)
	for i := 0; i < 100_000; {
		var msgs []outbox.Message
		for ; i < 100_000 && len(msgs) < 5000; i++ {
			msgs = append(msgs, outbox.Message{Topic: "pos/1/orders", Payload: payload})
		}
		if err := ob.Transact(ctx, func(tx *sql.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }); err != nil {
			b.Fatal(err)
		}
	}
	pub, err := outbox.NewMQTTPublisher(outbox.MQTTOptions{Broker: "tcp://127.0.0.1:1"})
	if err != nil {
		b.Fatal(err)
	}
	relay, err := ob.NewRelay(pub, outbox.RelayOptions{})
	if err != nil {
		b.Fatal(err)
	}
	exp := New(ob, Options{Relay: relay, RefreshInterval: time.Hour, SampleInterval: time.Hour, Logger: harness.TestLogger()})
	defer exp.Close()
	// The whole of /metrics, the Go runtime's and the process's metrics
	// and gzip (as Prometheus asks for it) included.
	b.Run("metrics", func(b *testing.B) {
		h := exp.Handler()
		for b.Loop() {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			req.Header.Set("Accept-Encoding", "gzip")
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Fatalf("scrape: %d\n%s", rec.Code, rec.Body.String())
			}
		}
	})
	// The whole of the till's /metrics: the same families written without
	// Prometheus's client, with its few runtime and process families.
	b.Run("till", func(b *testing.B) {
		h := exp.mon.TextMetrics()
		for b.Loop() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "\noutbox_pending_messages 100000\n") {
				b.Fatalf("scrape: %d\n%s", rec.Code, rec.Body.String())
			}
		}
	})
	// The exporter's own part.
	b.Run("collector", func(b *testing.B) {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(exp)
		for b.Loop() {
			mfs, err := reg.Gather()
			if err != nil {
				b.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() == "outbox_pending_messages" && mf.GetMetric()[0].GetGauge().GetValue() != 100_000 {
					b.Fatalf("pending %v", mf.GetMetric()[0].GetGauge().GetValue())
				}
			}
		}
	})
}

// TestPendingBytesRefreshed: without a byte limit the pending bytes are
// counted in the background, every RefreshInterval.
func TestPendingBytesRefreshed(t *testing.T) {
	r := startRig(t, rigOptions{exporter: Options{RefreshInterval: 50 * time.Millisecond}})
	r.proxy.Down()
	harness.Eventually(t, 10*time.Second, "disconnected", func() bool { return !r.relay.Metrics().Connected })
	r.commit(t, 3) // {"n":0}, {"n":1}, {"n":2}: 7 bytes each
	harness.Eventually(t, 10*time.Second, "21 pending bytes", func() bool {
		_, text := r.get(t, "/metrics")
		return strings.Contains(text, "\noutbox_pending_bytes 21\n")
	})
	_, text := r.get(t, "/metrics")
	require.Equal(t, "3", metricValue(t, text, "outbox_pending_messages"))
	require.NoError(t, r.proxy.Up())
	harness.Eventually(t, 10*time.Second, "0 pending bytes", func() bool {
		_, text := r.get(t, "/metrics")
		return strings.Contains(text, "\noutbox_pending_bytes 0\n")
	})
}

// TestScrapeErrorVisible: a family the exporter cannot read (the database
// is gone) leaves the relay's series in place on both expositions, and the
// error is logged and counted in promhttp_metric_handler_errors_total, so
// that a scrape that lost series is never silent.
func TestScrapeErrorVisible(t *testing.T) {
	var logs harness.LogBuffer
	r := startRig(t, rigOptions{exporter: Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
	r.commit(t, 1)
	harness.Eventually(t, 10*time.Second, "one published", func() bool { return r.relay.Metrics().Published == 1 })
	r.stop()
	require.NoError(t, r.ob.DB().Close())
	for _, srv := range []struct {
		name string
		*httptest.Server
	}{{"outboxprom", r.srv}, {"till", r.till}} {
		t.Run(srv.name, func(t *testing.T) {
			fetch(t, srv.Server, "/metrics")
			code, text := fetch(t, srv.Server, "/metrics")
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, text, "# TYPE outbox_connected gauge")
			require.NotContains(t, text, "outbox_pending_messages ", "what could not be read is left out")
			require.Regexp(t, `promhttp_metric_handler_errors_total\{cause="gathering"\} [1-9]`, text)
			require.Contains(t, logs.String(), "a scrape could not read every family")
			require.Contains(t, logs.String(), "outbox_pending_messages")
		})
	}
}
