package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/harness"
)

type fleetRun struct {
	Devices          int     `json:"devices"`
	Jitter           float64 `json:"jitter"`
	Committed        int     `json:"committed"`
	Delivered        int     `json:"delivered"`
	Lost             int     `json:"lost"`
	Phantom          int     `json:"phantom"`
	PeakBacklog      int     `json:"peak_backlog"`
	RecoveryAttempts int     `json:"recovery_attempts"`
	PeakPerSecond    int     `json:"peak_attempts_per_s"`
	ExternalBroker   bool    `json:"external_broker"`
}

func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	small := []string{"fleet", "--devices", "10", "--rate", "5", "--steady", "500ms", "--outage", "2s",
		"--reconnect-initial", "100ms", "--reconnect-max", "1s", "--dir", t.TempDir()}

	r := lab(t, append(small, "--json")...)
	require.Equal(t, 0, r.Code, "%s\n%s", r.Stdout, r.Stderr)
	var out struct{ Runs []fleetRun }
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &out), r.Stdout)
	require.Len(t, out.Runs, 2, "jitter on, then off")
	require.Equal(t, 0.5, out.Runs[0].Jitter)
	require.Zero(t, out.Runs[1].Jitter)
	for _, run := range out.Runs {
		require.Equal(t, 10, run.Devices)
		require.Positive(t, run.PeakBacklog)
		require.Zero(t, run.Lost)
		require.Zero(t, run.Phantom)
		require.Equal(t, run.Committed, run.Delivered)
		require.GreaterOrEqual(t, run.RecoveryAttempts, 10)
	}
	require.Contains(t, r.Stderr, "broker away for 2s")

	// Against a broker of the caller's, with the table.
	addr := harness.StartMochi(t, harness.MochiOptions{}).Addr()
	r = lab(t, append(small, "--broker", "tcp://"+addr, "--jitter", "on", "-q")...)
	require.Equal(t, 0, r.Code, "%s\n%s", r.Stdout, r.Stderr)
	require.Empty(t, r.Stderr)
	require.Contains(t, r.Stdout, "broker tcp://"+addr)
	require.Regexp(t, `\n\s+lost\s+0\n`, r.Stdout)
	require.NotContains(t, r.Stdout, "÷", "one run, no ratio")
}

func TestFleetUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"fleet", "--devices", "0"},
		{"fleet", "--rate", "-1"},
		{"fleet", "--payload", "10"},
		{"fleet", "--outage", "0s"},
		{"fleet", "--jitter", "sometimes"},
		{"fleet", "--reconnect-initial", "2s", "--reconnect-max", "1s"},
		{"fleet", "--broker", "http://127.0.0.1:1"},
	} {
		r := lab(t, args...)
		require.Equal(t, 2, r.Code, "%v: %s", args, r.Stderr)
		require.True(t, strings.HasPrefix(r.Stderr, "outboxlab: "), "%v: %q", args, r.Stderr)
	}
}
