-- Outbox schema migration 6 (frozen), 5 -> 6: an insert costs what a row
-- costs. Schema 5 ran two trigger programs for every row, of 187 and 557
-- opcodes; SQLite sets up a program's registers each time it starts one,
-- whether its WHEN holds or not, so they cost about half of what the row
-- itself did. Now every insert runs one small program that reads
-- outbox_state; the work needed only rarely (a seq at or below what was
-- sent or deleted, a limit set) is a program of its own, reached through
-- the view outbox_insert_checks, and runs only then.
--
-- A writer's seq into a gap above the mark, with no limit set, is no longer
-- looked for on every insert: the relay finds it when it marks that range
-- (a count of the rows in it) and moves it to the end, unpublished, as the
-- insert did before. The note of the pending row an INSERT OR REPLACE
-- deletes (replacing_seq, replacing_bytes, and the BEFORE INSERT trigger
-- that wrote it for every row) is gone: such a row, deleted without a
-- DELETE trigger unless the writer's connection set recursive_triggers,
-- stays counted, which only errs towards full, until the relay's mark
-- drains the outbox or the next Open counts again.

DROP TRIGGER outbox_replacing;
DROP TRIGGER outbox_inserted;
DROP TRIGGER outbox_pending_deleted;
ALTER TABLE outbox_state DROP COLUMN replacing_seq;
ALTER TABLE outbox_state DROP COLUMN replacing_bytes;

CREATE VIEW outbox_insert_checks AS SELECT 0 AS seq, 0 AS bytes WHERE 0;

CREATE TRIGGER outbox_insert_checked INSTEAD OF INSERT ON outbox_insert_checks
BEGIN
	UPDATE outbox SET seq = (SELECT 1 + max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq) FROM outbox_state WHERE id = 1)
	WHERE seq = NEW.seq AND ((SELECT NEW.seq <= max(seq_floor, sent_seq) FROM outbox_state WHERE id = 1)
		OR EXISTS (SELECT 1 FROM outbox WHERE seq > NEW.seq));
	UPDATE outbox_state SET
		skipped = skipped + NEW.seq - 1 - max(coalesce((SELECT max(seq) FROM outbox WHERE seq < NEW.seq), 0), seq_floor, sent_seq)
	WHERE id = 1 AND max_pending_count > 0 AND EXISTS (SELECT 1 FROM outbox WHERE seq = NEW.seq)
		AND NEW.seq - 1 > max(coalesce((SELECT max(seq) FROM outbox WHERE seq < NEW.seq), 0), seq_floor, sent_seq);
	SELECT RAISE(ABORT, 'outbox full: pending limit reached') FROM outbox_state
	WHERE id = 1 AND ((max_pending_count > 0
			AND max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq) - sent_seq - skipped > max_pending_count)
		OR (max_pending_bytes > 0 AND pending_bytes + NEW.bytes > max_pending_bytes));
	UPDATE outbox_state SET pending_bytes = pending_bytes + NEW.bytes
	WHERE id = 1 AND max_pending_bytes > 0;
END;

CREATE TRIGGER outbox_inserted AFTER INSERT ON outbox
WHEN (SELECT NEW.seq <= seq_floor OR NEW.seq <= sent_seq OR max_pending_count > 0 OR max_pending_bytes > 0 FROM outbox_state WHERE id = 1)
BEGIN INSERT INTO outbox_insert_checks (seq, bytes) VALUES (NEW.seq, length(CAST(NEW.payload AS BLOB))); END;

CREATE TRIGGER outbox_pending_deleted AFTER DELETE ON outbox
WHEN OLD.dead_at IS NULL
	AND (SELECT OLD.seq > sent_seq AND (max_pending_count > 0 OR max_pending_bytes > 0) FROM outbox_state WHERE id = 1)
BEGIN
	UPDATE outbox_state SET
		skipped = CASE WHEN max_pending_count > 0 THEN skipped + 1 ELSE 0 END,
		pending_bytes = CASE WHEN max_pending_bytes > 0 THEN max(pending_bytes - length(CAST(OLD.payload AS BLOB)), 0) ELSE 0 END
	WHERE id = 1;
END;
