package harness

import "database/sql"

// CheckPendingCounters compares what the outbox's limits are checked
// against with the rows themselves: the pending count the insert trigger
// computes (from skipped) and the pending bytes, each while its limit is
// set. It reads the tables of the table contract, nothing of the library,
// so that a test in any package (or one looking at a file a killed process
// left) can ask.
func CheckPendingCounters(tb TB, db *sql.DB) {
	tb.Helper()
	var hasSkipped bool
	must(tb, db.QueryRow(`SELECT count(*) FROM pragma_table_info('outbox_state') WHERE name = 'skipped'`).Scan(&hasSkipped), "outbox_state")
	counted := `0`
	if hasSkipped {
		counted = `max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq) - sent_seq - skipped`
	}
	// One statement, one snapshot: a relay may be marking meanwhile.
	var maxCount, maxBytes, bytes, count, wantCount, wantBytes int64
	must(tb, db.QueryRow(`SELECT max_pending_count, max_pending_bytes, pending_bytes, `+counted+`,
		(SELECT count(*) FROM outbox WHERE seq > st.sent_seq AND dead_at IS NULL),
		(SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM outbox WHERE seq > st.sent_seq AND dead_at IS NULL)
		FROM outbox_state st`).Scan(&maxCount, &maxBytes, &bytes, &count, &wantCount, &wantBytes), "pending counters")
	if maxBytes > 0 && bytes != wantBytes {
		tb.Fatalf("pending_bytes against the rows: %d, the rows say %d", bytes, wantBytes)
	}
	if maxCount > 0 && hasSkipped && count != wantCount {
		tb.Fatalf("the pending count the limit sees, against the rows: %d, the rows say %d", count, wantCount)
	}
}
