package outboxprom

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestCommandsGauge: outbox_commands counts a real outbox's commands by
// state, each state a series, 0 for a state with none; promtool finds
// nothing to say of it.
func TestCommandsGauge(t *testing.T) {
	ob, err := outbox.Open(context.Background(), filepath.Join(t.TempDir(), "outbox.db"), outbox.Options{Logger: harness.TestLogger()})
	require.NoError(t, err)
	defer ob.Close()
	exp := New(ob, Options{Logger: harness.TestLogger()})
	defer exp.Close()
	srv := httptest.NewServer(exp.Handler())
	defer srv.Close()

	_, text := fetch(t, srv, "/metrics")
	require.Contains(t, text, "# TYPE outbox_commands gauge\n")
	for _, state := range []string{"waiting", "applied", "expired", "failed", "malformed"} {
		require.Contains(t, text, "\noutbox_commands{state=\""+state+"\"} 0\n", state)
	}

	now := time.Now().UnixMilli()
	for i, state := range []string{"applied", "received", "applied", "expired", "applied", "malformed", "received", "received"} {
		_, err := ob.DB().Exec(`INSERT INTO outbox_command (id, topic, data, received_at, received_clock_ms, state) VALUES (?, 'tills/7/commands', '{}', ?, 0, ?)`,
			"c-"+string(rune('a'+i)), now, state)
		require.NoError(t, err)
	}
	_, text = fetch(t, srv, "/metrics")
	for state, n := range map[string]string{"waiting": "3", "applied": "3", "expired": "1", "failed": "0", "malformed": "1"} {
		require.Contains(t, text, "\noutbox_commands{state=\""+state+"\"} "+n+"\n", state)
	}
	harness.LintMetrics(t, text)
}
