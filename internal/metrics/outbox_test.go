package metrics

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// value returns the value of a family's only sample, failing if the family
// is not there or has not exactly one.
func value(t *testing.T, families []Family, name string) float64 {
	t.Helper()
	for _, f := range families {
		if f.Name == name {
			require.NoError(t, f.Err, name)
			require.Len(t, f.Samples, 1, name)
			return f.Samples[0].Value
		}
	}
	t.Fatalf("no family %s", name)
	return 0
}

func names(families []Family) []string {
	var out []string
	for _, f := range families {
		out = append(out, f.Name)
	}
	return out
}

// TestDefinitions: the relay's families only with a relay; every name
// unique, with help, a type and the conventions' suffixes.
func TestDefinitions(t *testing.T) {
	all, alone := Definitions(true), Definitions(false)
	require.Len(t, all, 24)
	require.Len(t, alone, 11)
	seen := map[string]bool{}
	for _, f := range all {
		require.False(t, seen[f.Name], "%s twice", f.Name)
		seen[f.Name] = true
		require.NotEmpty(t, f.Help, f.Name)
		require.Equal(t, f.Type == Counter, strings.HasSuffix(f.Name, "_total"), "%s: a counter's name, and only a counter's, ends in _total", f.Name)
		require.Empty(t, f.Samples)
	}
	for _, f := range alone {
		require.True(t, seen[f.Name])
		require.NotContains(t, []string{"outbox_published_total", "outbox_connected"}, f.Name)
	}
}

// TestOutboxReadsSnapshot reads each family from a snapshot whose values
// all differ, so that a family reading another's field fails.
func TestOutboxReadsSnapshot(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	rm := outbox.RelayMetrics{
		Connected: true, ConnectionAttempts: 11, Disconnected: 12500 * time.Millisecond, Published: 13, DeadLettered: 14,
		AttemptsCharged: 15, InFlight: 16, HoldsLease: false, LastWriteOK: true, Protocol: "3.1.1", Source: "/till/\xff7",
		BrokerUnavailable: "the broker says quota exceeded (0x97)", BrokerUnavailableSince: now.Add(-18 * time.Second),
		NoSubscribers: 19,
	}
	rm.PublishAck.Counts[0], rm.PublishAck.Count, rm.PublishAck.Sum = 2, 3, 4.5
	rm.CommitAck.Count = 17
	s := Snapshot{Now: now, Version: "v9", Relay: &rm, ScannedPendingBytes: 99, Gauges: outbox.Gauges{
		Pending: 1, PendingBytes: 2, PendingBytesKnown: true, OldestPending: now.Add(-90 * time.Second), Dead: 3,
		DatabaseBytes: 4, WALBytes: 5, FreeBytes: 6, FreeBytesKnown: true,
		Priorities: []outbox.PriorityStats{{Priority: 9, Pending: 7, OldestPending: now.Add(-20 * time.Second)}, {Priority: 0, Pending: 8, OldestPending: now.Add(-21 * time.Second)}},
		Commands:   outbox.CommandStats{Waiting: 22, Applied: 23, Expired: 24, Failed: 25, Malformed: 26},
	}}
	fs := Outbox(s)
	require.Equal(t, names(Definitions(true)), names(fs))
	for name, want := range map[string]float64{
		"outbox_pending_messages": 1, "outbox_pending_bytes": 2, "outbox_oldest_pending_age_seconds": 90, "outbox_dead_messages": 3,
		"outbox_database_bytes": 4, "outbox_wal_bytes": 5, "outbox_filesystem_free_bytes": 6,
		"outbox_connected": 1, "outbox_connection_attempts_total": 11, "outbox_disconnected_seconds_total": 12.5,
		"outbox_published_total": 13, "outbox_dead_lettered_total": 14, "outbox_attempts_charged_total": 15,
		"outbox_in_flight_messages": 16, "outbox_lease_held": 0, "outbox_last_write_ok": 1, "outbox_info": 1,
		"outbox_broker_unavailable_seconds": 18, "outbox_no_subscribers_total": 19,
	} {
		require.Equal(t, want, value(t, fs, name), name)
	}
	for _, f := range fs {
		switch f.Name {
		case "outbox_info":
			require.Equal(t, []string{"MQTT 3.1.1", "/till/\uFFFD7", "v9"}, f.Samples[0].LabelValues, "valid UTF-8 whatever the source")
		case "outbox_priority_pending_messages":
			require.Equal(t, []string{"priority"}, f.Labels)
			require.Equal(t, []Sample{{LabelValues: []string{"9"}, Value: 7}, {LabelValues: []string{"0"}, Value: 8}}, f.Samples)
		case "outbox_priority_oldest_pending_age_seconds":
			require.Equal(t, []string{"priority"}, f.Labels)
			require.Equal(t, []Sample{{LabelValues: []string{"9"}, Value: 20}, {LabelValues: []string{"0"}, Value: 21}}, f.Samples)
		case "outbox_commands":
			require.Equal(t, []string{"state"}, f.Labels)
			require.Equal(t, []Sample{{LabelValues: []string{"waiting"}, Value: 22}, {LabelValues: []string{"applied"}, Value: 23},
				{LabelValues: []string{"expired"}, Value: 24}, {LabelValues: []string{"failed"}, Value: 25}, {LabelValues: []string{"malformed"}, Value: 26}}, f.Samples)
		case "outbox_publish_ack_seconds", "outbox_commit_ack_seconds":
			h := f.Samples[0].Hist
			require.Equal(t, outbox.HistogramBounds(), h.Bounds)
			require.Len(t, h.Counts, len(h.Bounds))
			if f.Name == "outbox_publish_ack_seconds" {
				require.Equal(t, HistogramValue{Bounds: h.Bounds, Counts: rm.PublishAck.Counts[:], Count: 3, Sum: 4.5}, *h)
			} else {
				require.Equal(t, uint64(17), h.Count)
			}
		}
	}

	t.Run("pending bytes counted in the background, free space unknown", func(t *testing.T) {
		s := s
		s.Gauges.PendingBytesKnown, s.Gauges.FreeBytesKnown, s.Gauges.OldestPending, s.Gauges.Priorities = false, false, time.Time{}, nil
		fs := Outbox(s)
		require.Equal(t, 99.0, value(t, fs, "outbox_pending_bytes"))
		require.Equal(t, 0.0, value(t, fs, "outbox_oldest_pending_age_seconds"), "nothing pending")
		for _, f := range fs {
			switch f.Name {
			case "outbox_filesystem_free_bytes", "outbox_priority_pending_messages", "outbox_priority_oldest_pending_age_seconds":
				require.Empty(t, f.Samples, f.Name)
				require.NoError(t, f.Err, f.Name)
			}
		}
	})
	t.Run("oldest written ahead of this clock", func(t *testing.T) {
		s := s
		s.Gauges.OldestPending = now.Add(time.Minute)
		require.Equal(t, 0.0, value(t, Outbox(s), "outbox_oldest_pending_age_seconds"))
	})
	t.Run("no relay", func(t *testing.T) {
		s := s
		s.Relay = nil
		fs := Outbox(s)
		require.Equal(t, names(Definitions(false)), names(fs))
		for _, f := range fs {
			if f.Name == "outbox_info" {
				require.Equal(t, []string{"", "", "v9"}, f.Samples[0].LabelValues)
			}
		}
	})
	t.Run("the database failed", func(t *testing.T) {
		s := s
		s.GaugesErr = errors.New("database is locked")
		fs := Outbox(s)
		require.Equal(t, names(Definitions(true)), names(fs))
		for _, f := range fs {
			if strings.HasPrefix(f.Name, "outbox_") && f.Name != "outbox_info" && !relayFamily(f.Name) {
				require.ErrorIs(t, f.Err, s.GaugesErr, f.Name)
				require.Empty(t, f.Samples, f.Name)
			} else {
				require.NoError(t, f.Err, f.Name)
				require.Len(t, f.Samples, 1, f.Name)
			}
		}
	})
}

func relayFamily(name string) bool {
	for _, f := range Definitions(false) {
		if f.Name == name {
			return false
		}
	}
	return true
}
