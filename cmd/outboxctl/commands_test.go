package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// commandRow is a row of outbox_command, as a receiver and the commands'
// worker leave it (the SQL contract).
type commandRow struct {
	id, topic, state, reason, response string
	attempts                           int
	received                           time.Time
}

// insertCommands writes rows into outbox_command as a writer of the SQL
// contract would, each with data no listing may show.
func insertCommands(t *testing.T, ob *outbox.Outbox, rows ...commandRow) {
	t.Helper()
	for _, r := range rows {
		var reason, response, done any
		if r.reason != "" {
			reason = r.reason
		}
		if r.response != "" {
			response = r.response
		}
		if r.state != "received" {
			done = r.received.Add(time.Second).UnixMilli()
		}
		_, err := ob.DB().Exec(`INSERT INTO outbox_command (id, source, topic, type, data, response_topic, received_at, received_clock_ms,
			state, attempts, reason, done_at) VALUES (?, '/backend', ?, 'price.set', '{"price":"SECRET-DATA"}', ?, ?, 0, ?, ?, ?, ?)`,
			r.id, r.topic, response, r.received.UnixMilli(), r.state, r.attempts, reason, done)
		require.NoError(t, err)
	}
}

// TestStatusListCommands: status counts the commands by state, in a line
// of its own only when there are any; list --commands lists them in
// arrival order, all or those of one state, never their data.
func TestStatusListCommands(t *testing.T) {
	path, ob := newOutbox(t)

	// None yet: zeros in the JSON, no line, an empty list.
	r := ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, `"commands": {
    "waiting": 0,
    "applied": 0,
    "expired": 0,
    "failed": 0,
    "malformed": 0
  }`)
	r = ctl(t, "status", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stdout, "commands")
	r = ctl(t, "list", "--db", path, "--commands", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "[]\n", r.Stdout)

	now := time.Now()
	insertCommands(t, ob,
		commandRow{id: "c-1", topic: "tills/7/commands", state: "applied", response: "backend/answers", received: now.Add(-time.Hour)},
		commandRow{id: "c-2", topic: "tills/7/commands", state: "expired", reason: "deadline passed 3s before it arrived", received: now.Add(-50 * time.Minute)},
		commandRow{id: "c-3", topic: "tills/7/commands", state: "applied", response: "backend/answers", received: now.Add(-40 * time.Minute)},
		commandRow{id: "c-4", topic: "tills/7/commands", state: "failed", attempts: 5, reason: "price: no such item\x1b[31m 42", received: now.Add(-30 * time.Minute)},
		commandRow{id: "c-5", topic: "tills/7/commands", state: "malformed", reason: "not a CloudEvent: no id", received: now.Add(-20 * time.Minute)},
		commandRow{id: "c-6", topic: "tills/7/commands", state: "received", attempts: 2, reason: "handler: database is locked", received: now.Add(-10 * time.Minute)},
		commandRow{id: "c-7", topic: "tills/7/commands", state: "received", reason: "waiting for a trusted clock", received: now.Add(-time.Minute)},
		commandRow{id: "c-8", topic: "tills/7/commands", state: "applied", received: now},
	)

	r = ctl(t, "status", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^commands +2 waiting, 3 applied, 1 expired, 1 failed, 1 malformed$`, r.Stdout)
	r = ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var st struct {
		Commands map[string]int64 `json:"commands"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	require.Equal(t, map[string]int64{"waiting": 2, "applied": 3, "expired": 1, "failed": 1, "malformed": 1}, st.Commands)

	r = ctl(t, "list", "--db", path, "--commands")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `^SEQ +ID +TOPIC +STATE +ATTEMPTS +REASON +RECEIVED\n`, r.Stdout)
	lines := strings.Split(strings.TrimSuffix(r.Stdout, "\n"), "\n")
	require.Len(t, lines, 9, r.Stdout)
	require.Regexp(t, `^1 +c-1 +tills/7/commands +applied +0 +- +1h0m0s ago$`, lines[1])
	require.Regexp(t, `^4 +c-4 +tills/7/commands +failed +5 +price: no such item\x{FFFD}\[31m 42 +30m\d+s ago$`, lines[4], "a control character from a handler's error is not written to the terminal")
	require.Regexp(t, `^6 +c-6 +tills/7/commands +waiting +2 +handler: database is locked +10m\d+s ago$`, lines[6])
	require.Regexp(t, `^8 +c-8 `, lines[8])

	r = ctl(t, "list", "--db", path, "--commands", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stdout, "SECRET-DATA", "a command's data is never shown")
	var cmds []struct {
		Seq           int64      `json:"seq"`
		ID            string     `json:"id"`
		Source        string     `json:"source"`
		Type          string     `json:"type"`
		State         string     `json:"state"`
		Attempts      int        `json:"attempts"`
		Reason        string     `json:"reason"`
		ResponseTopic *string    `json:"response_topic"`
		ReceivedAt    time.Time  `json:"received_at"`
		DoneAt        *time.Time `json:"done_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &cmds))
	require.Len(t, cmds, 8)
	require.Equal(t, "c-1", cmds[0].ID)
	require.Equal(t, "/backend", cmds[0].Source)
	require.Equal(t, "price.set", cmds[0].Type)
	require.Equal(t, "backend/answers", *cmds[0].ResponseTopic)
	require.Equal(t, now.Add(-time.Hour).UnixMilli(), cmds[0].ReceivedAt.UnixMilli())
	require.Equal(t, now.Add(-time.Hour+time.Second).UnixMilli(), cmds[0].DoneAt.UnixMilli())
	require.Nil(t, cmds[1].ResponseTopic, "no answer topic")
	require.Equal(t, "received", cmds[5].State)
	require.Nil(t, cmds[5].DoneAt, "not done")
	require.Equal(t, "price: no such item\x1b[31m 42", cmds[3].Reason, "JSON carries the reason as it is, escaped")

	for _, c := range []struct {
		state string
		ids   []string
	}{{"waiting", []string{"c-6", "c-7"}}, {"applied", []string{"c-1", "c-3", "c-8"}}, {"expired", []string{"c-2"}},
		{"failed", []string{"c-4"}}, {"malformed", []string{"c-5"}}} {
		r = ctl(t, "list", "--db", path, "--commands", "--state", c.state, "--json")
		require.Equal(t, 0, r.Code, r.Stderr)
		cmds = nil
		require.NoError(t, json.Unmarshal([]byte(r.Stdout), &cmds))
		var ids []string
		for _, cmd := range cmds {
			ids = append(ids, cmd.ID)
		}
		require.Equal(t, c.ids, ids, c.state)
	}
	r = ctl(t, "list", "--db", path, "--commands", "--after", "2", "--limit", "2")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Len(t, regexp.MustCompile(`(?m)^\d+ +c-`).FindAllString(r.Stdout, -1), 2, r.Stdout)
	require.Regexp(t, `(?m)^3 +c-3 `, r.Stdout)

	for _, bad := range []struct {
		args []string
		says string
	}{
		{[]string{"--state", "pending"}, `--state "pending" with --commands: want waiting, applied, expired, failed or malformed`},
		{[]string{"--payload"}, "--payload: a command's data is never shown"},
		{[]string{"--priority", "9"}, "--priority: commands have no priority"},
	} {
		r = ctl(t, append([]string{"list", "--db", path, "--commands"}, bad.args...)...)
		require.Equal(t, 2, r.Code, bad.args)
		require.Contains(t, r.Stderr, bad.says)
	}
}
