-- The recount, run by every Open after it stores the limits it was given:
-- what the limits are checked against, counted again from the rows. That is
-- the numbers above the common mark that hold no pending message (a row at
-- or below its priority's mark is sent), and the pending bytes, each only
-- while its limit is set (otherwise nothing keeps them).
-- The triggers in outbox.sql keep both exact for every writer that follows
-- the table contract, but for a pending row that INSERT OR REPLACE deletes
-- without recursive_triggers, which stays counted (towards full) until the
-- relay drains the outbox; a writer that deletes pending rows by hand can
-- leave them off too, and this puts both right. Migration 3 counted them
-- once, the same way.
UPDATE outbox_state SET
	skipped = CASE WHEN max_pending_count > 0
		THEN max(max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq) - sent_seq
			- (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND dead_at IS NULL
				AND seq > CASE priority WHEN 0 THEN outbox_state.sent_seq_0 WHEN 1 THEN outbox_state.sent_seq_1 WHEN 2 THEN outbox_state.sent_seq_2 WHEN 3 THEN outbox_state.sent_seq_3 WHEN 4 THEN outbox_state.sent_seq_4 WHEN 5 THEN outbox_state.sent_seq_5 WHEN 6 THEN outbox_state.sent_seq_6 WHEN 7 THEN outbox_state.sent_seq_7 WHEN 8 THEN outbox_state.sent_seq_8 WHEN 9 THEN outbox_state.sent_seq_9 END), 0)
		ELSE 0 END,
	pending_bytes = CASE WHEN max_pending_bytes > 0
		THEN (SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM outbox WHERE seq > outbox_state.sent_seq AND dead_at IS NULL
			AND seq > CASE priority WHEN 0 THEN outbox_state.sent_seq_0 WHEN 1 THEN outbox_state.sent_seq_1 WHEN 2 THEN outbox_state.sent_seq_2 WHEN 3 THEN outbox_state.sent_seq_3 WHEN 4 THEN outbox_state.sent_seq_4 WHEN 5 THEN outbox_state.sent_seq_5 WHEN 6 THEN outbox_state.sent_seq_6 WHEN 7 THEN outbox_state.sent_seq_7 WHEN 8 THEN outbox_state.sent_seq_8 WHEN 9 THEN outbox_state.sent_seq_9 END)
		ELSE 0 END
WHERE id = 1 AND (max_pending_count > 0 OR max_pending_bytes > 0 OR skipped <> 0 OR pending_bytes <> 0);
