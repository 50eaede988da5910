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
	// A row is pending when it is not dead and above the common mark and,
	// since schema 9, above its priority's mark.
	var priorities bool
	must(tb, db.QueryRow(`SELECT count(*) FROM pragma_table_info('outbox_state') WHERE name = 'sent_seq_9'`).Scan(&priorities), "outbox_state")
	pending := `o.seq > st.sent_seq AND o.dead_at IS NULL`
	if priorities {
		pending += ` AND o.seq > CASE o.priority WHEN 0 THEN st.sent_seq_0 WHEN 1 THEN st.sent_seq_1 WHEN 2 THEN st.sent_seq_2
			WHEN 3 THEN st.sent_seq_3 WHEN 4 THEN st.sent_seq_4 WHEN 5 THEN st.sent_seq_5 WHEN 6 THEN st.sent_seq_6
			WHEN 7 THEN st.sent_seq_7 WHEN 8 THEN st.sent_seq_8 WHEN 9 THEN st.sent_seq_9 END`
	}
	// One statement, one snapshot: a relay may be marking meanwhile.
	var maxCount, maxBytes, bytes, count, wantCount, wantBytes int64
	must(tb, db.QueryRow(`SELECT max_pending_count, max_pending_bytes, pending_bytes, `+counted+`,
		(SELECT count(*) FROM outbox o WHERE `+pending+`),
		(SELECT coalesce(sum(length(CAST(o.payload AS BLOB))), 0) FROM outbox o WHERE `+pending+`)
		FROM outbox_state st`).Scan(&maxCount, &maxBytes, &bytes, &count, &wantCount, &wantBytes), "pending counters")
	if maxBytes > 0 && bytes != wantBytes {
		tb.Fatalf("pending_bytes against the rows: %d, the rows say %d", bytes, wantBytes)
	}
	if maxCount > 0 && hasSkipped && count != wantCount {
		tb.Fatalf("the pending count the limit sees, against the rows: %d, the rows say %d", count, wantCount)
	}
}
