package monitor

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestCommandsShown: the commands a real outbox received, by state, as its
// status page (a line of its own, only once there are any) and its
// /metrics show them.
func TestCommandsShown(t *testing.T) {
	ob, err := outbox.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"), outbox.Options{Logger: harness.TestLogger()})
	require.NoError(t, err)
	defer ob.Close()
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
	require.NotContains(t, page, `id="commands"`, "no command yet: no line")
	require.Contains(t, get("/metrics"), "\noutbox_commands{state=\"waiting\"} 0\noutbox_commands{state=\"applied\"} 0\n")

	now := time.Now().UnixMilli()
	for i, state := range []string{"applied", "received", "expired", "applied", "malformed", "received", "applied", "failed", "applied"} {
		_, err := ob.DB().Exec(`INSERT INTO outbox_command (id, topic, data, received_at, received_clock_ms, state) VALUES (?, 'tills/7/commands', '{}', ?, 0, ?)`,
			"c-"+string(rune('a'+i)), now, state)
		require.NoError(t, err)
	}
	page = get("/")
	require.Contains(t, page, `<div class="muted">Commands from the backend</div><div id="commands">2 waiting, 4 applied, 1 expired, 1 failed, 1 malformed</div>`)
	require.Contains(t, get("/metrics"), "\noutbox_commands{state=\"waiting\"} 2\noutbox_commands{state=\"applied\"} 4\n"+
		"outbox_commands{state=\"expired\"} 1\noutbox_commands{state=\"failed\"} 1\noutbox_commands{state=\"malformed\"} 1\n")
}
