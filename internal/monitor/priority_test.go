package monitor

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestPrioritiesShown: what waits at each priority of a real outbox, as its
// status page and its /metrics show it, highest first, and nothing of a
// priority once nothing waits there.
func TestPrioritiesShown(t *testing.T) {
	ob, err := outbox.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"), outbox.Options{Logger: harness.TestLogger()})
	require.NoError(t, err)
	defer ob.Close()
	now := time.Now()
	for _, r := range []struct {
		prio int
		age  time.Duration
	}{{0, time.Hour}, {9, 2 * time.Minute}, {0, time.Minute}, {9, time.Minute}, {9, 0}} {
		_, err := ob.DB().Exec(`INSERT INTO outbox (topic, payload, priority, created_at) VALUES ('till-7/alarms', '{}', ?, ?)`, r.prio, now.Add(-r.age).UnixMilli())
		require.NoError(t, err)
	}
	m := New(ob, Options{Logger: harness.TestLogger()})
	defer m.Close()
	srv := httptest.NewServer(m.Handler(m.TextMetrics()))
	defer srv.Close()
	get := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	page := get("/")
	require.Contains(t, page, `id="pending">5<`)
	require.Regexp(t, `id="priorities">priority 9: 3 pending, oldest 2 min \d+ s<br>priority 0: 2 pending, oldest (59 min \d+ s|1 h 0 min)</div>`, page)
	body := get("/metrics")
	require.Contains(t, body, "\noutbox_priority_pending_messages{priority=\"9\"} 3\noutbox_priority_pending_messages{priority=\"0\"} 2\n")
	require.Regexp(t, `\noutbox_priority_oldest_pending_age_seconds\{priority="9"\} 1[12]\d(\.\d+)?\noutbox_priority_oldest_pending_age_seconds\{priority="0"\} 36\d\d(\.\d+)?\n`, body)

	// Priority 0 sent: only priority 9 is left.
	_, err = ob.DB().Exec(`UPDATE outbox_state SET sent_seq_0 = 3, sent_seq = 1, seq_floor = max(seq_floor, 3)`)
	require.NoError(t, err)
	page = get("/")
	require.Contains(t, page, `id="pending">3<`)
	require.Regexp(t, `id="priorities">priority 9: 3 pending, oldest 2 min \d+ s</div>`, page)
	body = get("/metrics")
	require.Contains(t, body, "\noutbox_priority_pending_messages{priority=\"9\"} 3\n")
	require.NotRegexp(t, regexp.MustCompile(`priority="0"`), body)
}
