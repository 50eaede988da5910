-- Outbox schema migration 2 (frozen), 1 -> 2: a sent high-water mark instead of a
-- state per row. Schema 1 paid, in every business transaction, for an
-- AUTOINCREMENT counter, a unique index on id, a partial index of pending rows
-- and a counters row kept by a trigger; now a message is one row in one
-- b-tree, and the relay records per batch the seq up to which everything is
-- settled (outbox_state.sent_seq). Deleting the newest row records its seq in
-- outbox_state.seq_floor, so numbers are never reused without AUTOINCREMENT.


CREATE TABLE outbox_state (
	id                INTEGER PRIMARY KEY CHECK (id = 1),
	sent_seq          INTEGER NOT NULL DEFAULT 0,
	sent_at           INTEGER,
	max_pending_count INTEGER NOT NULL DEFAULT 0,
	max_pending_bytes INTEGER NOT NULL DEFAULT 0,
	pending_bytes     INTEGER NOT NULL DEFAULT 0,
	seq_floor         INTEGER NOT NULL DEFAULT 0
);

-- Everything at or below the old table's settled rows (or below its
-- AUTOINCREMENT counter, when its newest rows were deleted) counts as done;
-- pending rows below that line move above it, in order.
INSERT INTO outbox_state (id, sent_seq, max_pending_count, max_pending_bytes, seq_floor)
SELECT 1, CASE WHEN q > m THEN q ELSE n END, c.max_pending_count, c.max_pending_bytes, max(q, m)
FROM outbox_counters c,
	(SELECT coalesce((SELECT max(seq) FROM outbox), 0) AS m,
	        coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0) AS q,
	        coalesce((SELECT max(seq) FROM outbox WHERE state <> 'pending'), 0) AS n)
WHERE c.id = 1;


CREATE TABLE outbox_sent_log (
	seq     INTEGER PRIMARY KEY,
	sent_at INTEGER NOT NULL
);
INSERT INTO outbox_sent_log (seq, sent_at)
SELECT sent_seq, coalesce((SELECT max(sent_at) FROM outbox WHERE state = 'sent'), CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))
FROM outbox_state WHERE sent_seq > 0;


CREATE TABLE outbox_v2 (
	seq          INTEGER PRIMARY KEY,
	id           TEXT    NOT NULL DEFAULT (lower(printf('%08x-%04x-7%03x-%04x-%012x', CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) / 65536, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) % 65536, random() & 4095, 32768 | (random() & 16383), random() & 281474976710655))),
	topic        TEXT    NOT NULL CHECK (length(topic) > 0 AND instr(topic, '+') = 0 AND instr(topic, '#') = 0 AND instr(topic, char(0)) = 0),
	payload      BLOB    NOT NULL,
	type         TEXT    NOT NULL DEFAULT '',
	content_type TEXT    NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)),
	attempts     INTEGER NOT NULL DEFAULT 0,
	last_error   TEXT,
	dead_at      INTEGER
);
INSERT INTO outbox_v2 (seq, id, topic, payload, type, content_type, created_at, attempts, last_error, dead_at)
SELECT seq, id, topic, payload, type, content_type, created_at, attempts, last_error,
	CASE WHEN state = 'dead' THEN coalesce(dead_at, created_at) END
FROM outbox
WHERE state <> 'pending' OR seq > (SELECT sent_seq FROM outbox_state)
ORDER BY seq;
INSERT INTO outbox_v2 (seq, id, topic, payload, type, content_type, created_at, attempts, last_error)
SELECT (SELECT max(coalesce((SELECT max(seq) FROM outbox_v2), 0), seq_floor) FROM outbox_state) + row_number() OVER (ORDER BY seq),
	id, topic, payload, type, content_type, created_at, attempts, last_error
FROM outbox
WHERE state = 'pending' AND seq < (SELECT sent_seq FROM outbox_state)
ORDER BY seq;

DROP TABLE outbox;
DROP TABLE outbox_counters;
ALTER TABLE outbox_v2 RENAME TO outbox;

UPDATE outbox_state SET pending_bytes = (SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0)
	FROM outbox WHERE seq > outbox_state.sent_seq AND dead_at IS NULL)
WHERE max_pending_bytes > 0;


CREATE INDEX outbox_dead ON outbox (seq) WHERE dead_at IS NOT NULL;

-- A mark is one statement on outbox_state; this logs when it was made.
CREATE TRIGGER outbox_sent_logged AFTER UPDATE OF sent_seq ON outbox_state
BEGIN INSERT OR REPLACE INTO outbox_sent_log (seq, sent_at) VALUES (NEW.sent_seq, coalesce(NEW.sent_at, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))); END;

-- A UUIDv7 (NewID, or the SQL default) is unique by construction; only
-- other ids, chosen by the writer (business keys), cost an index entry.
CREATE UNIQUE INDEX outbox_chosen_id ON outbox (id)
WHERE NOT (length(id) = 36 AND substr(id, 15, 1) = '7' AND substr(id, 9, 1) = '-');

-- Without limits (the default) an insert only reads outbox_state. The
-- pending count is bounded by max(seq) - sent_seq (dead rows and gaps above
-- the mark count too, until the mark passes them): one b-tree seek, no
-- counter to write. Pending bytes are counted only while a byte limit is set.
CREATE TRIGGER outbox_capacity BEFORE INSERT ON outbox
WHEN (SELECT max_pending_count > 0 OR max_pending_bytes > 0 FROM outbox_state WHERE id = 1)
BEGIN
	SELECT RAISE(ABORT, 'outbox full: pending limit reached') FROM outbox_state
	WHERE id = 1 AND ((max_pending_count > 0 AND coalesce((SELECT max(seq) FROM outbox), 0) - sent_seq >= max_pending_count)
		OR (max_pending_bytes > 0 AND pending_bytes + length(CAST(NEW.payload AS BLOB)) > max_pending_bytes));
	UPDATE outbox_state SET pending_bytes = pending_bytes + length(CAST(NEW.payload AS BLOB))
	WHERE id = 1 AND max_pending_bytes > 0;
END;

CREATE TRIGGER outbox_bytes_dead AFTER UPDATE OF dead_at ON outbox
WHEN OLD.dead_at IS NULL AND NEW.dead_at IS NOT NULL
BEGIN UPDATE outbox_state SET pending_bytes = max(pending_bytes - length(CAST(OLD.payload AS BLOB)), 0)
	WHERE id = 1 AND max_pending_bytes > 0 AND OLD.seq > sent_seq; END;

CREATE TRIGGER outbox_newest_deleted BEFORE DELETE ON outbox
WHEN OLD.seq = (SELECT max(seq) FROM outbox)
BEGIN UPDATE outbox_state SET seq_floor = max(seq_floor, OLD.seq) WHERE id = 1; END;

CREATE TRIGGER outbox_seq_floor AFTER INSERT ON outbox
WHEN NEW.seq <= (SELECT seq_floor FROM outbox_state WHERE id = 1)
BEGIN UPDATE outbox SET seq = (SELECT seq_floor FROM outbox_state WHERE id = 1) + 1 WHERE seq = NEW.seq; END;

-- Schema 1's columns, state and sent_at derived, for readers and tools.
CREATE VIEW outbox_messages AS
SELECT o.seq, o.id, o.topic, o.payload, o.type, o.content_type, o.created_at,
	CASE WHEN o.dead_at IS NOT NULL THEN 'dead' WHEN o.seq <= st.sent_seq THEN 'sent' ELSE 'pending' END AS state,
	o.attempts, o.last_error,
	CASE WHEN o.dead_at IS NULL AND o.seq <= st.sent_seq
		THEN (SELECT l.sent_at FROM outbox_sent_log l WHERE l.seq >= o.seq ORDER BY l.seq LIMIT 1) END AS sent_at,
	o.dead_at
FROM outbox o, outbox_state st WHERE st.id = 1;
