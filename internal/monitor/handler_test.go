package monitor

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
	"github.com/edgeoutbox/outbox/internal/metrics"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestWithoutRelay serves the endpoints of an outbox that no relay in this
// process drains (outboxprom's tests cover a relay's): ready never, the page
// says so, /metrics has the outbox's families and not the relay's.
func TestWithoutRelay(t *testing.T) {
	ob, err := outbox.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"), outbox.Options{Logger: harness.TestLogger()})
	require.NoError(t, err)
	defer ob.Close()
	m := New(ob, Options{Logger: harness.TestLogger()})
	defer m.Close()
	srv := httptest.NewServer(m.Handler(m.TextMetrics()))
	defer srv.Close()
	get := func(path string) (*http.Response, string) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(b)
	}
	resp, body := get("/healthz")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "ok\n", body)
	resp, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "not ready: no relay in this process\n", body)
	resp, body = get("/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, "No relay runs in this process")
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'")
	resp, body = get("/metrics")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, metrics.ContentType, resp.Header.Get("Content-Type"))
	require.Contains(t, body, "\noutbox_pending_messages 0\n")
	require.Contains(t, body, `outbox_info{protocol="",source="",version="dev"} 1`)
	require.Contains(t, body, "\n# TYPE go_goroutines gauge\n")
	require.NotContains(t, body, "outbox_connected")
	resp, body = get("/nothing")
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	post, err := http.Post(srv.URL+"/requeue", "application/x-www-form-urlencoded", strings.NewReader("token=x"))
	require.NoError(t, err)
	post.Body.Close()
	require.Equal(t, http.StatusForbidden, post.StatusCode, "read-only without a token")
}

// TestExpiredListedApart: the page of a real outbox with one dead and two
// expired messages counts one dead, lists it, and lists the two expired
// ones under their own heading (the counters count both as parked).
func TestExpiredListedApart(t *testing.T) {
	ob, err := outbox.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"), outbox.Options{Logger: harness.TestLogger()})
	require.NoError(t, err)
	defer ob.Close()
	for _, r := range []struct {
		topic, why string
		expired    int
	}{{"till-7/refunds", "not authorized (0x87)", 0}, {"till-7/offers", "expired before its turn", 1}, {"till-7/offers", "expired before its turn", 1}} {
		_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload, attempts, last_error, dead_at, expired) VALUES (?, '{}', 1, ?, ?, ?)`,
			r.topic, r.why, time.Now().UnixMilli(), r.expired)
		require.NoError(t, err)
	}
	m := New(ob, Options{Logger: harness.TestLogger()})
	defer m.Close()
	srv := httptest.NewServer(m.Handler(m.TextMetrics()))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	page := string(b)
	require.Contains(t, page, `id="dead-count">1<`, "the expired ones are not dead")
	require.Equal(t, 1, strings.Count(page, "not authorized (0x87)"))
	require.Contains(t, page, "<h2>Expired messages</h2>")
	require.Equal(t, 2, strings.Count(page, "expired before its turn"), "both expired messages listed")
}
