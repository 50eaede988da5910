package main

import (
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// TestStatusListByPriority: status says how many messages wait at each
// priority that has any, highest first, and since when; list shows each
// message's priority and --priority lists one priority's.
func TestStatusListByPriority(t *testing.T) {
	path, ob := newOutbox(t)
	enqueue(t, ob,
		outbox.Message{Topic: "stores/1/sales", Payload: []byte(`{"sale":1}`)},
		outbox.Message{Topic: "stores/1/alarms", Payload: []byte(`{"alarm":1}`), Priority: 9},
		outbox.Message{Topic: "stores/1/sales", Payload: []byte(`{"sale":2}`)},
		outbox.Message{Topic: "stores/1/stock", Payload: []byte(`{"stock":1}`), Priority: 4},
		outbox.Message{Topic: "stores/1/alarms", Payload: []byte(`{"alarm":2}`), Priority: 9},
	)
	old := time.Now().Add(-time.Hour)
	_, err := ob.DB().Exec(`UPDATE outbox SET created_at = ? WHERE seq = 1`, old.UnixMilli())
	require.NoError(t, err)
	_, err = ob.DB().Exec(`UPDATE outbox SET created_at = ? WHERE seq = 2`, old.Add(10*time.Minute).UnixMilli())
	require.NoError(t, err)

	r := ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var st struct {
		Pending    int64 `json:"pending"`
		Priorities []struct {
			Priority          int       `json:"priority"`
			Pending           int64     `json:"pending"`
			OldestPendingAt   time.Time `json:"oldest_pending_at"`
			OldestPendingAgeS float64   `json:"oldest_pending_age_seconds"`
		} `json:"priorities"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &st))
	require.EqualValues(t, 5, st.Pending)
	require.Len(t, st.Priorities, 3, r.Stdout)
	for i, want := range []struct {
		priority int
		pending  int64
	}{{9, 2}, {4, 1}, {0, 2}} {
		require.Equal(t, want.priority, st.Priorities[i].Priority, r.Stdout)
		require.Equal(t, want.pending, st.Priorities[i].Pending, r.Stdout)
	}
	require.Equal(t, old.UnixMilli(), st.Priorities[2].OldestPendingAt.UnixMilli(), "priority 0's oldest")
	require.InDelta(t, 50*60, st.Priorities[0].OldestPendingAgeS, 60, "priority 9's oldest: 50 min old")

	r = ctl(t, "status", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^  priority 9 +2 messages, oldest 50m0s ago\n  priority 4 +1 messages, oldest \S+ ago\n  priority 0 +2 messages, oldest 1h0m0s ago$`, r.Stdout)

	r = ctl(t, "list", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	var recs []struct {
		Seq      int64  `json:"seq"`
		Priority int    `json:"priority"`
		Topic    string `json:"topic"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &recs))
	require.Len(t, recs, 5)
	var prios []int
	for _, rec := range recs {
		prios = append(prios, rec.Priority)
	}
	require.Equal(t, []int{0, 9, 0, 4, 9}, prios, "in seq order, each with its priority")

	r = ctl(t, "list", "--db", path)
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Regexp(t, `(?m)^SEQ +PRIORITY +ID +TOPIC`, r.Stdout)
	require.Regexp(t, `(?m)^2 +9 +\S+ +stores/1/alarms`, r.Stdout)

	r = ctl(t, "list", "--db", path, "--priority", "9", "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	recs = nil
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &recs))
	require.Len(t, recs, 2)
	require.EqualValues(t, 2, recs[0].Seq)
	require.EqualValues(t, 5, recs[1].Seq)
	r = ctl(t, "list", "--db", path, "--priority", "0")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Len(t, regexp.MustCompile(`(?m)^\d+ +0 `).FindAllString(r.Stdout, -1), 2, r.Stdout)
	require.NotContains(t, r.Stdout, "alarms")

	for _, bad := range []string{"10", "-1"} {
		r = ctl(t, "list", "--db", path, "--priority", bad)
		require.Equal(t, 2, r.Code, bad)
		require.Contains(t, r.Stderr, "--priority "+bad+": want 0 to 9")
	}

	// Nothing pending: an empty array, no line.
	_, err = ob.DB().Exec(`DELETE FROM outbox`)
	require.NoError(t, err)
	r = ctl(t, "status", "--db", path, "--json")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, `"priorities": []`)
	r = ctl(t, "status", "--db", path)
	require.NotContains(t, r.Stdout, "priority")
}
