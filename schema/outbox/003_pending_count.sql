-- Outbox schema migration 3 (frozen), 2 -> 3: the limits count what is pending.
-- Schema 2 bounded the pending count by max(seq) - sent_seq, so dead rows and
-- the gaps they leave filled the limit; it counted bytes before an insert, so
-- INSERT OR IGNORE counted rows it never inserted; and a writer that set seq at
-- or below what was sent had its row taken as sent. Now outbox_state.skipped
-- counts the numbers above the mark that hold no pending row, bytes are counted
-- after the insert, every row is numbered above all others, and the lease says
-- where its holder runs.

ALTER TABLE outbox_state ADD COLUMN skipped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN replacing_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN replacing_bytes INTEGER NOT NULL DEFAULT 0;

ALTER TABLE outbox_lease ADD COLUMN host TEXT NOT NULL DEFAULT '';
ALTER TABLE outbox_lease ADD COLUMN machine_id TEXT NOT NULL DEFAULT '';
ALTER TABLE outbox_lease ADD COLUMN boot_id TEXT NOT NULL DEFAULT '';
ALTER TABLE outbox_lease ADD COLUMN pid INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_lease ADD COLUMN pid_start INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_lease ADD COLUMN pid_ns TEXT NOT NULL DEFAULT '';

DROP TRIGGER outbox_capacity;
DROP TRIGGER outbox_bytes_dead;
DROP TRIGGER outbox_seq_floor;

CREATE TRIGGER outbox_replacing BEFORE INSERT ON outbox
WHEN NOT (length(NEW.id) = 36 AND substr(NEW.id, 15, 1) = '7' AND substr(NEW.id, 9, 1) = '-')
	AND (SELECT (max_pending_count > 0 OR max_pending_bytes > 0) AND (replacing_seq <> 0 OR EXISTS (SELECT 1 FROM outbox o
		WHERE o.id = NEW.id AND NOT (length(o.id) = 36 AND substr(o.id, 15, 1) = '7' AND substr(o.id, 9, 1) = '-')))
	FROM outbox_state WHERE id = 1)
BEGIN
	UPDATE outbox_state SET
		replacing_seq = coalesce((SELECT o.seq FROM outbox o
			WHERE o.id = NEW.id AND NOT (length(o.id) = 36 AND substr(o.id, 15, 1) = '7' AND substr(o.id, 9, 1) = '-')
				AND o.seq > outbox_state.sent_seq AND o.dead_at IS NULL), 0),
		replacing_bytes = coalesce((SELECT length(CAST(o.payload AS BLOB)) FROM outbox o
			WHERE o.id = NEW.id AND NOT (length(o.id) = 36 AND substr(o.id, 15, 1) = '7' AND substr(o.id, 9, 1) = '-')
				AND o.seq > outbox_state.sent_seq AND o.dead_at IS NULL), 0)
	WHERE id = 1;
END;

CREATE TRIGGER outbox_inserted AFTER INSERT ON outbox
WHEN (SELECT NEW.seq <= max(seq_floor, sent_seq) OR max_pending_count > 0 OR max_pending_bytes > 0 FROM outbox_state WHERE id = 1)
	OR EXISTS (SELECT 1 FROM outbox WHERE seq > NEW.seq)
BEGIN
	UPDATE outbox SET seq = (SELECT 1 + max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq) FROM outbox_state WHERE id = 1)
	WHERE seq = NEW.seq AND ((SELECT NEW.seq <= max(seq_floor, sent_seq) FROM outbox_state WHERE id = 1)
		OR EXISTS (SELECT 1 FROM outbox WHERE seq > NEW.seq));
	UPDATE outbox_state SET
		skipped = CASE WHEN max_pending_count = 0 THEN 0 ELSE skipped
			+ CASE WHEN EXISTS (SELECT 1 FROM outbox WHERE seq = NEW.seq)
				THEN max(NEW.seq - 1 - max(coalesce((SELECT max(seq) FROM outbox WHERE seq < NEW.seq), 0), seq_floor, sent_seq), 0)
				ELSE 0 END
			+ CASE WHEN replacing_seq <> 0
					AND NOT (length(NEW.id) = 36 AND substr(NEW.id, 15, 1) = '7' AND substr(NEW.id, 9, 1) = '-')
					AND NOT EXISTS (SELECT 1 FROM outbox WHERE seq = outbox_state.replacing_seq)
					AND replacing_seq <= max(coalesce((SELECT max(seq) FROM outbox WHERE seq < NEW.seq), 0), seq_floor, sent_seq)
				THEN 1 ELSE 0 END
			END,
		pending_bytes = CASE WHEN max_pending_bytes = 0 THEN 0
			WHEN replacing_seq <> 0
				AND NOT (length(NEW.id) = 36 AND substr(NEW.id, 15, 1) = '7' AND substr(NEW.id, 9, 1) = '-')
				AND NOT EXISTS (SELECT 1 FROM outbox WHERE seq = outbox_state.replacing_seq)
			THEN max(pending_bytes - replacing_bytes, 0) ELSE pending_bytes END,
		replacing_seq = CASE WHEN NOT (length(NEW.id) = 36 AND substr(NEW.id, 15, 1) = '7' AND substr(NEW.id, 9, 1) = '-')
			THEN 0 ELSE replacing_seq END,
		replacing_bytes = CASE WHEN NOT (length(NEW.id) = 36 AND substr(NEW.id, 15, 1) = '7' AND substr(NEW.id, 9, 1) = '-')
			THEN 0 ELSE replacing_bytes END
	WHERE id = 1 AND ((replacing_seq <> 0 AND NOT (length(NEW.id) = 36 AND substr(NEW.id, 15, 1) = '7' AND substr(NEW.id, 9, 1) = '-'))
		OR (max_pending_count > 0 AND EXISTS (SELECT 1 FROM outbox WHERE seq = NEW.seq)
			AND NEW.seq - 1 > max(coalesce((SELECT max(seq) FROM outbox WHERE seq < NEW.seq), 0), seq_floor, sent_seq)));
	SELECT RAISE(ABORT, 'outbox full: pending limit reached') FROM outbox_state
	WHERE id = 1 AND ((max_pending_count > 0
			AND max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq) - sent_seq - skipped > max_pending_count)
		OR (max_pending_bytes > 0 AND pending_bytes + length(CAST(NEW.payload AS BLOB)) > max_pending_bytes));
	UPDATE outbox_state SET pending_bytes = pending_bytes + length(CAST(NEW.payload AS BLOB))
	WHERE id = 1 AND max_pending_bytes > 0;
END;

CREATE TRIGGER outbox_dead_changed AFTER UPDATE OF dead_at ON outbox
WHEN (OLD.dead_at IS NULL) <> (NEW.dead_at IS NULL)
	AND (SELECT max_pending_count > 0 OR max_pending_bytes > 0 FROM outbox_state WHERE id = 1)
BEGIN
	UPDATE outbox_state SET
		skipped = CASE WHEN max_pending_count = 0 THEN 0
			WHEN NEW.dead_at IS NOT NULL AND OLD.seq > sent_seq THEN skipped + 1
			WHEN NEW.dead_at IS NULL AND NEW.seq = OLD.seq AND OLD.seq > sent_seq THEN max(skipped - 1, 0)
			ELSE skipped END,
		pending_bytes = CASE WHEN max_pending_bytes = 0 THEN 0
			WHEN NEW.dead_at IS NOT NULL AND OLD.seq > sent_seq THEN max(pending_bytes - length(CAST(OLD.payload AS BLOB)), 0)
			WHEN NEW.dead_at IS NULL AND NEW.seq > sent_seq THEN pending_bytes + length(CAST(NEW.payload AS BLOB))
			ELSE pending_bytes END
	WHERE id = 1;
END;

CREATE TRIGGER outbox_payload_changed AFTER UPDATE OF payload ON outbox
WHEN OLD.dead_at IS NULL AND NEW.dead_at IS NULL
	AND (SELECT max_pending_bytes > 0 AND NEW.seq > sent_seq FROM outbox_state WHERE id = 1)
BEGIN
	UPDATE outbox_state SET pending_bytes = max(pending_bytes - length(CAST(OLD.payload AS BLOB)) + length(CAST(NEW.payload AS BLOB)), 0)
	WHERE id = 1;
END;

CREATE TRIGGER outbox_pending_deleted AFTER DELETE ON outbox
WHEN OLD.dead_at IS NULL
	AND (SELECT OLD.seq > sent_seq AND (max_pending_count > 0 OR max_pending_bytes > 0) FROM outbox_state WHERE id = 1)
BEGIN
	UPDATE outbox_state SET
		skipped = CASE WHEN max_pending_count > 0 THEN skipped + 1 ELSE 0 END,
		pending_bytes = CASE WHEN max_pending_bytes > 0 THEN max(pending_bytes - length(CAST(OLD.payload AS BLOB)), 0) ELSE 0 END,
		replacing_seq = CASE WHEN replacing_seq = OLD.seq THEN 0 ELSE replacing_seq END,
		replacing_bytes = CASE WHEN replacing_seq = OLD.seq THEN 0 ELSE replacing_bytes END
	WHERE id = 1;
END;

-- Count what is pending now, once.
UPDATE outbox_state SET
	skipped = CASE WHEN max_pending_count > 0
		THEN max(max(coalesce((SELECT max(seq) FROM outbox), 0), seq_floor, sent_seq) - sent_seq
			- (SELECT count(*) FROM outbox WHERE seq > outbox_state.sent_seq AND dead_at IS NULL), 0)
		ELSE 0 END,
	pending_bytes = CASE WHEN max_pending_bytes > 0
		THEN (SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM outbox WHERE seq > outbox_state.sent_seq AND dead_at IS NULL)
		ELSE 0 END
WHERE id = 1;
