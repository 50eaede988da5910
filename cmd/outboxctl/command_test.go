package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

// TestCommandSendAndRelayCommands: `relay --commands` stores the commands
// of the till's topic in outbox_command; an application that knows only
// SQL (as one in another language would) applies them by the documented
// contract; `command send` sends one as a backend would, over either
// version, and prints the answer, exit 0 for "applied", 1 for any other
// answer or none within --wait.
func TestCommandSendAndRelayCommands(t *testing.T) {
	m := harness.StartMosquitto(t, harness.MosquittoOptions{})
	path, ob := newOutbox(t)
	relay := exec.Command(binary, "relay", "--db", path, "--broker", m.URL(), "--client-id", "till-7",
		"--commands", "tills/7/commands", "--log-format", "json", "--stats-interval", "0", "--backoff-max", "200ms")
	var logs harness.LogBuffer
	relay.Stderr = &logs
	require.NoError(t, relay.Start())
	defer relay.Process.Kill()
	harness.Eventually(t, 10*time.Second, "the commands connection subscribed", func() bool {
		return strings.Contains(logs.String(), `"msg":"outbox subscriber connected"`) && strings.Contains(logs.String(), `"commands":"till-7-commands"`)
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	applied := make(chan string, 8)
	go applyBySQL(ctx, ob.DB(), func(data []byte) bool { return !strings.Contains(string(data), "refuse") }, applied)

	for _, proto := range []string{"5", "3.1.1"} {
		r := ctl(t, "command", "send", "--broker", m.URL(), "--topic", "tills/7/commands", "--data", `{"price":3}`,
			"--wait", "10s", "--protocol", proto)
		require.Equal(t, 0, r.Code, "%s: %s", proto, r.Stderr)
		var ans map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.Stdout), &ans), r.Stdout)
		require.Equal(t, "applied", ans["status"], proto)
		require.Equal(t, map[string]any{"price": 3.0}, ans["result"], proto)
		require.Equal(t, ans["command"], <-applied, proto)
	}

	r := ctl(t, "command", "send", "--broker", m.URL(), "--topic", "tills/7/commands", "--data", `"refuse"`, "--wait", "10s",
		"--answer-topic", "tills/7/answers/ops")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, `"status":"failed"`)
	require.Contains(t, r.Stderr, "failed")

	// No device on this topic: the wait ends it.
	r = ctl(t, "command", "send", "--broker", m.URL(), "--topic", "tills/8/commands", "--wait", "500ms", "--lifetime", "1s")
	require.Equal(t, 1, r.Code)
	require.Contains(t, r.Stderr, "no answer to command")
	require.Empty(t, r.Stdout)

	stopRelay(t, relay, &logs)
}

// applyBySQL is an application that applies commands by the SQL contract
// only (docs/commands.md): in one transaction, the oldest waiting command,
// marked applied (or failed when ok says no), and its answer enqueued.
// It sends the id of each one applied.
func applyBySQL(ctx context.Context, db *sql.DB, ok func(data []byte) bool, applied chan<- string) {
	for ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond) // an application's poll
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			continue
		}
		var seq int64
		var id, source string
		var data []byte
		var respTopic sql.NullString
		var corr []byte
		err = tx.QueryRow(`SELECT seq, id, source, data, response_topic, correlation_data FROM outbox_command
			WHERE state = 'received' ORDER BY seq LIMIT 1`).Scan(&seq, &id, &source, &data, &respTopic, &corr)
		if err != nil {
			tx.Rollback()
			continue
		}
		status, extra := "applied", `,"result":`+string(data)
		if !ok(data) {
			status, extra = "failed", `,"reason":"refused by the application"`
		}
		res, err := tx.Exec(`UPDATE outbox_command SET state = ?, done_at = ? WHERE seq = ? AND state = 'received'`,
			status, time.Now().UnixMilli(), seq)
		if n, _ := res.RowsAffected(); err != nil || n != 1 {
			tx.Rollback()
			continue
		}
		if respTopic.Valid {
			idJSON, _ := json.Marshal(id)
			srcJSON, _ := json.Marshal(source)
			answer := `{"command":` + string(idJSON) + `,"source":` + string(srcJSON) + `,"status":"` + status + `"` + extra + `}`
			if _, err := tx.Exec(`INSERT INTO outbox (topic, payload, type, content_type, correlation_data, priority)
				VALUES (?, ?, 'outbox.command.answer', 'application/json', ?, 9)`, respTopic.String, answer, corr); err != nil {
				tx.Rollback()
				continue
			}
		}
		if tx.Commit() == nil && status == "applied" {
			applied <- id
		}
	}
}

// TestCommandFlagsRefused: what cannot work is a usage error (exit 2)
// before anything is opened or connects: --commands without a fixed client
// id (the relay's default names the process, and would lose the session at
// each restart), command send without a topic or with data that is not
// JSON.
func TestCommandFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "till.db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--commands", "tills/7/commands"}, "--commands needs --client-id or --commands-client-id"},
		{[]string{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--commands-client-id", "c"}, "--commands-client-id needs --commands"},
		{[]string{"relay", "--db", path, "--broker", "tcp://127.0.0.1:1", "--client-id", "a", "--commands", "t", "--commands-client-id", "a"}, "must differ"},
		{[]string{"command", "send", "--broker", "tcp://127.0.0.1:1"}, "--topic"},
		{[]string{"command", "send", "--broker", "tcp://127.0.0.1:1", "--topic", "t", "--data", "{"}, "--data: not valid JSON"},
		{[]string{"command", "send", "--broker", "tcp://127.0.0.1:1", "--topic", "t/#"}, "--topic"},
		{[]string{"command", "send", "--broker", "tcp://127.0.0.1:1", "--topic", "t", "--protocol", "3"}, "--protocol"},
		{[]string{"command", "send", "--topic", "t"}, "give one --broker"},
	} {
		r := ctl(t, c.args...)
		require.Equal(t, 2, r.Code, "%v: %s", c.args, r.Stderr)
		require.Contains(t, r.Stderr, c.want, c.args)
	}
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, left, "nothing written")
}
