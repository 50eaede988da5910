package examples_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/edgeoutbox/outbox"
	"github.com/edgeoutbox/outbox/internal/harness"
)

var writerSummary = regexp.MustCompile(`(?m)^committed (\d+), rolled back (\d+)$`)

// TestSidecar runs the Python writer against a database that
// `outboxctl relay` drains, and checks that exactly the committed sales'
// events reached the broker, in commit order.
func TestSidecar(t *testing.T) {
	t.Parallel()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	ctl := filepath.Join(t.TempDir(), "outboxctl")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", ctl, "../cmd/outboxctl").CombinedOutput()
	require.NoError(t, err, "%s", out)

	// A broker with a subscriber inside it.
	b := harness.StartMochi(t, harness.MochiOptions{})
	var mu sync.Mutex
	var got []outbox.Event
	require.NoError(t, b.Subscribe("shop/#", func(m harness.Message) {
		ev, err := outbox.DecodeEvent(m.Payload)
		if err != nil {
			ev = outbox.Event{Type: "undecodable: " + err.Error()} // fails the checks below
		}
		mu.Lock()
		got = append(got, ev)
		mu.Unlock()
	}))

	db := filepath.Join(t.TempDir(), "shop.db")
	out, err = exec.Command(ctl, "init", "--db", db).CombinedOutput()
	require.NoError(t, err, "%s", out)
	relay := exec.Command(ctl, "relay", "--db", db, "--broker", b.URL(), "--source", "/shops/1", "--log-level", "warn")
	require.NoError(t, relay.Start())
	defer relay.Process.Kill()

	out, err = exec.Command(python, "sidecar/writer.py", db, "50").CombinedOutput()
	require.NoError(t, err, "%s", out)
	m := writerSummary.FindStringSubmatch(string(out))
	require.NotNil(t, m, "writer output: %s", out)
	require.Equal(t, []string{"40", "10"}, m[1:], "committed, rolled back")

	deadline := time.Now().Add(runTimeout)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 40 {
			break
		}
		require.True(t, time.Now().Before(deadline), "delivered %d of 40", n)
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, relay.Process.Signal(syscall.SIGTERM))
	require.NoError(t, relay.Wait(), "relay exits 0 on SIGTERM")

	// Exactly the committed sales, once each, in commit order.
	conn, err := sql.Open("sqlite", db)
	require.NoError(t, err)
	defer conn.Close()
	committed := map[int]bool{}
	rows, err := conn.Query(`SELECT id FROM sales`)
	require.NoError(t, err)
	for rows.Next() {
		var id int
		require.NoError(t, rows.Scan(&id))
		committed[id] = true
	}
	require.NoError(t, rows.Err())
	require.Len(t, committed, 40)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 40)
	seen := map[int]bool{}
	for i, ev := range got {
		require.Equal(t, "/shops/1", ev.Source)
		require.Equal(t, "com.example.shop.SaleRecorded", ev.Type)
		if i > 0 {
			require.Greater(t, ev.Sequence, got[i-1].Sequence, "commit order")
		}
		var sale struct {
			Sale int `json:"sale"`
		}
		require.NoError(t, json.Unmarshal(ev.Data, &sale))
		require.True(t, committed[sale.Sale], "event of sale %d, which rolled back", sale.Sale)
		require.False(t, seen[sale.Sale], "sale %d twice", sale.Sale)
		seen[sale.Sale] = true
	}
}
