-- Outbox schema migration 9 (frozen), 8 -> 9: priorities. A message has a
-- priority, 0 to 9 (higher first, 0 by default), and the relay publishes
-- each priority in commit order, the highest pending first: a row may be
-- sent before older rows of lower priorities. So each priority has its own
-- mark, sent_seq_P: every message of priority P up to it is settled.
-- sent_seq keeps its meaning for every priority (every message up to it is
-- settled): the common mark, which the marks move up to the first pending
-- row. A row is sent when it is not dead and its seq is at or below either.
--
-- seq_floor now holds the newest seq ever marked too, so that the rule
-- that renumbers a row at or below max(seq_floor, sent_seq) keeps every
-- new row above every priority's mark, and the insert path is unchanged.
-- The index outbox_priority is what the relay seeks the next pending row of
-- a priority above 0 in; rows of priority 0, the default, are read by seq
-- and cost an insert nothing more. Each mark of a priority is logged with
-- it: a row's sent_at is its priority's first entry at or above its seq.
--
-- Every row of an older file has priority 0, and what was sent stays sent.

ALTER TABLE outbox ADD COLUMN priority INTEGER NOT NULL DEFAULT 0 CHECK (typeof(priority) = 'integer' AND priority BETWEEN 0 AND 9);
ALTER TABLE outbox_state ADD COLUMN sent_seq_0 INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN sent_seq_1 INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN sent_seq_2 INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN sent_seq_3 INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN sent_seq_4 INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN sent_seq_5 INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN sent_seq_6 INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN sent_seq_7 INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN sent_seq_8 INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN sent_seq_9 INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_sent_log ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;

DROP TRIGGER outbox_sent_logged;
UPDATE outbox_state SET sent_seq_0 = sent_seq, sent_seq_1 = sent_seq, sent_seq_2 = sent_seq,
	sent_seq_3 = sent_seq, sent_seq_4 = sent_seq, sent_seq_5 = sent_seq, sent_seq_6 = sent_seq,
	sent_seq_7 = sent_seq, sent_seq_8 = sent_seq, sent_seq_9 = sent_seq,
	seq_floor = max(seq_floor, sent_seq)
WHERE id = 1;

CREATE INDEX outbox_priority ON outbox (priority, seq) WHERE priority > 0 AND dead_at IS NULL;

CREATE TRIGGER outbox_sent_logged_0 AFTER UPDATE OF sent_seq_0 ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at, priority) VALUES (NEW.sent_seq_0, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 0); END;
CREATE TRIGGER outbox_sent_logged_1 AFTER UPDATE OF sent_seq_1 ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at, priority) VALUES (NEW.sent_seq_1, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 1); END;
CREATE TRIGGER outbox_sent_logged_2 AFTER UPDATE OF sent_seq_2 ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at, priority) VALUES (NEW.sent_seq_2, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 2); END;
CREATE TRIGGER outbox_sent_logged_3 AFTER UPDATE OF sent_seq_3 ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at, priority) VALUES (NEW.sent_seq_3, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 3); END;
CREATE TRIGGER outbox_sent_logged_4 AFTER UPDATE OF sent_seq_4 ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at, priority) VALUES (NEW.sent_seq_4, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 4); END;
CREATE TRIGGER outbox_sent_logged_5 AFTER UPDATE OF sent_seq_5 ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at, priority) VALUES (NEW.sent_seq_5, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 5); END;
CREATE TRIGGER outbox_sent_logged_6 AFTER UPDATE OF sent_seq_6 ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at, priority) VALUES (NEW.sent_seq_6, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 6); END;
CREATE TRIGGER outbox_sent_logged_7 AFTER UPDATE OF sent_seq_7 ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at, priority) VALUES (NEW.sent_seq_7, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 7); END;
CREATE TRIGGER outbox_sent_logged_8 AFTER UPDATE OF sent_seq_8 ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at, priority) VALUES (NEW.sent_seq_8, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 8); END;
CREATE TRIGGER outbox_sent_logged_9 AFTER UPDATE OF sent_seq_9 ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at, priority) VALUES (NEW.sent_seq_9, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 9); END;

-- The triggers that keep the limits' counters test "pending" as above.
DROP TRIGGER outbox_dead_changed;
DROP TRIGGER outbox_payload_changed;
DROP TRIGGER outbox_pending_deleted;

CREATE TRIGGER outbox_dead_changed AFTER UPDATE OF dead_at ON outbox
WHEN (OLD.dead_at IS NULL) <> (NEW.dead_at IS NULL)
	AND (SELECT max_pending_count > 0 OR max_pending_bytes > 0 FROM outbox_state WHERE id = 1)
BEGIN
	UPDATE outbox_state SET
		skipped = CASE WHEN max_pending_count = 0 THEN 0
			WHEN NEW.dead_at IS NOT NULL AND OLD.seq > sent_seq AND OLD.seq > CASE OLD.priority WHEN 0 THEN sent_seq_0 WHEN 1 THEN sent_seq_1 WHEN 2 THEN sent_seq_2 WHEN 3 THEN sent_seq_3 WHEN 4 THEN sent_seq_4 WHEN 5 THEN sent_seq_5 WHEN 6 THEN sent_seq_6 WHEN 7 THEN sent_seq_7 WHEN 8 THEN sent_seq_8 WHEN 9 THEN sent_seq_9 END THEN skipped + 1
			WHEN NEW.dead_at IS NULL AND NEW.seq = OLD.seq AND OLD.seq > sent_seq AND NEW.seq > CASE NEW.priority WHEN 0 THEN sent_seq_0 WHEN 1 THEN sent_seq_1 WHEN 2 THEN sent_seq_2 WHEN 3 THEN sent_seq_3 WHEN 4 THEN sent_seq_4 WHEN 5 THEN sent_seq_5 WHEN 6 THEN sent_seq_6 WHEN 7 THEN sent_seq_7 WHEN 8 THEN sent_seq_8 WHEN 9 THEN sent_seq_9 END THEN max(skipped - 1, 0)
			ELSE skipped END,
		pending_bytes = CASE WHEN max_pending_bytes = 0 THEN 0
			WHEN NEW.dead_at IS NOT NULL AND OLD.seq > sent_seq AND OLD.seq > CASE OLD.priority WHEN 0 THEN sent_seq_0 WHEN 1 THEN sent_seq_1 WHEN 2 THEN sent_seq_2 WHEN 3 THEN sent_seq_3 WHEN 4 THEN sent_seq_4 WHEN 5 THEN sent_seq_5 WHEN 6 THEN sent_seq_6 WHEN 7 THEN sent_seq_7 WHEN 8 THEN sent_seq_8 WHEN 9 THEN sent_seq_9 END THEN max(pending_bytes - length(CAST(OLD.payload AS BLOB)), 0)
			WHEN NEW.dead_at IS NULL AND NEW.seq > sent_seq AND NEW.seq > CASE NEW.priority WHEN 0 THEN sent_seq_0 WHEN 1 THEN sent_seq_1 WHEN 2 THEN sent_seq_2 WHEN 3 THEN sent_seq_3 WHEN 4 THEN sent_seq_4 WHEN 5 THEN sent_seq_5 WHEN 6 THEN sent_seq_6 WHEN 7 THEN sent_seq_7 WHEN 8 THEN sent_seq_8 WHEN 9 THEN sent_seq_9 END THEN pending_bytes + length(CAST(NEW.payload AS BLOB))
			ELSE pending_bytes END
	WHERE id = 1;
END;

CREATE TRIGGER outbox_payload_changed AFTER UPDATE OF payload ON outbox
WHEN OLD.dead_at IS NULL AND NEW.dead_at IS NULL
	AND (SELECT max_pending_bytes > 0 AND NEW.seq > sent_seq AND NEW.seq > CASE NEW.priority WHEN 0 THEN sent_seq_0 WHEN 1 THEN sent_seq_1 WHEN 2 THEN sent_seq_2 WHEN 3 THEN sent_seq_3 WHEN 4 THEN sent_seq_4 WHEN 5 THEN sent_seq_5 WHEN 6 THEN sent_seq_6 WHEN 7 THEN sent_seq_7 WHEN 8 THEN sent_seq_8 WHEN 9 THEN sent_seq_9 END FROM outbox_state WHERE id = 1)
BEGIN
	UPDATE outbox_state SET pending_bytes = max(pending_bytes - length(CAST(OLD.payload AS BLOB)) + length(CAST(NEW.payload AS BLOB)), 0)
	WHERE id = 1;
END;

CREATE TRIGGER outbox_pending_deleted AFTER DELETE ON outbox
WHEN OLD.dead_at IS NULL
	AND (SELECT OLD.seq > sent_seq AND OLD.seq > CASE OLD.priority WHEN 0 THEN sent_seq_0 WHEN 1 THEN sent_seq_1 WHEN 2 THEN sent_seq_2 WHEN 3 THEN sent_seq_3 WHEN 4 THEN sent_seq_4 WHEN 5 THEN sent_seq_5 WHEN 6 THEN sent_seq_6 WHEN 7 THEN sent_seq_7 WHEN 8 THEN sent_seq_8 WHEN 9 THEN sent_seq_9 END AND (max_pending_count > 0 OR max_pending_bytes > 0) FROM outbox_state WHERE id = 1)
BEGIN
	UPDATE outbox_state SET
		skipped = CASE WHEN max_pending_count > 0 THEN skipped + 1 ELSE 0 END,
		pending_bytes = CASE WHEN max_pending_bytes > 0 THEN max(pending_bytes - length(CAST(OLD.payload AS BLOB)), 0) ELSE 0 END
	WHERE id = 1;
END;

DROP VIEW outbox_messages;
CREATE VIEW outbox_messages AS
SELECT o.seq, o.id, o.topic, o.payload, o.type, o.content_type, o.created_at,
	CASE WHEN o.dead_at IS NOT NULL THEN CASE WHEN o.expired THEN 'expired' ELSE 'dead' END
		WHEN o.seq <= st.sent_seq OR o.seq <= CASE o.priority WHEN 0 THEN st.sent_seq_0 WHEN 1 THEN st.sent_seq_1 WHEN 2 THEN st.sent_seq_2 WHEN 3 THEN st.sent_seq_3 WHEN 4 THEN st.sent_seq_4 WHEN 5 THEN st.sent_seq_5 WHEN 6 THEN st.sent_seq_6 WHEN 7 THEN st.sent_seq_7 WHEN 8 THEN st.sent_seq_8 WHEN 9 THEN st.sent_seq_9 END THEN 'sent' ELSE 'pending' END AS state,
	o.attempts, o.last_error,
	CASE WHEN o.dead_at IS NULL AND (o.seq <= st.sent_seq OR o.seq <= CASE o.priority WHEN 0 THEN st.sent_seq_0 WHEN 1 THEN st.sent_seq_1 WHEN 2 THEN st.sent_seq_2 WHEN 3 THEN st.sent_seq_3 WHEN 4 THEN st.sent_seq_4 WHEN 5 THEN st.sent_seq_5 WHEN 6 THEN st.sent_seq_6 WHEN 7 THEN st.sent_seq_7 WHEN 8 THEN st.sent_seq_8 WHEN 9 THEN st.sent_seq_9 END)
		THEN (SELECT l.sent_at FROM outbox_sent_log l WHERE l.seq >= o.seq AND l.priority = o.priority ORDER BY l.seq LIMIT 1) END AS sent_at,
	o.dead_at, o.priority
FROM outbox o, outbox_state st WHERE st.id = 1;
