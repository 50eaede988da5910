-- The outbox schema, version 10: what a new database gets, in one step.
-- A database of an older version is brought here by the files in outbox/,
-- one per version, which are never edited once released. The tests check that
-- both roads lead to the same tables, columns, indexes, triggers and views.
--
-- The contract for writers in any language: INSERT INTO outbox (topic,
-- payload) in the same transaction as the business rows, and priority (0 to
-- 9, higher first) if not 0; every other column has a default. Writers never set seq (a trigger renumbers a row whose seq is
-- at or below what was sent or deleted, and the relay one it finds behind
-- it), never update rows, and never write outbox_state.

-- One row per message. A row is dead when dead_at is set (expired when
-- expired = 1 too); sent when dead_at is NULL and its seq is at or below
-- outbox_state.sent_seq or its priority's mark (sent_seq_0 ... sent_seq_9);
-- pending otherwise. Nothing else is written per message: no state column,
-- and a row of priority 0 (the default) costs no index entry.
CREATE TABLE outbox (
	seq          INTEGER PRIMARY KEY,
	-- A UUIDv7 built in plain SQL (milliseconds, then random bits), so rows
	-- from other languages get a stable, time-sortable id without help.
	id           TEXT    NOT NULL DEFAULT (lower(printf('%08x-%04x-7%03x-%04x-%012x', CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) / 65536, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) % 65536, random() & 4095, 32768 | (random() & 16383), random() & 281474976710655))),
	topic        TEXT    NOT NULL CHECK (length(topic) > 0 AND instr(topic, '+') = 0 AND instr(topic, '#') = 0 AND instr(topic, char(0)) = 0),
	payload      BLOB    NOT NULL,
	type         TEXT    NOT NULL DEFAULT '',
	content_type TEXT    NOT NULL DEFAULT '',
	-- Unix milliseconds by the writer's clock: shown, never used for order.
	created_at   INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)),
	attempts     INTEGER NOT NULL DEFAULT 0,
	last_error   TEXT,
	dead_at      INTEGER,
	-- When the message expires, in milliseconds on the outbox clock
	-- (outbox_state.clock_ms), never by a wall clock; NULL: never. A writer
	-- sets it to clock_ms + the message's life.
	expires_at   INTEGER,
	-- Set, with dead_at, by the relay for a message whose time was up at
	-- its turn: parked, not published.
	expired      INTEGER NOT NULL DEFAULT 0,
	-- 0 to 9, higher first: the relay publishes the highest priority
	-- pending first, and each priority in seq (commit) order. (Not "IN (0,
	-- ..., 9)": SQLite builds a table of a list of constants at every
	-- INSERT, which cost each one about 2 µs.)
	priority     INTEGER NOT NULL DEFAULT 0 CHECK (typeof(priority) = 'integer' AND priority BETWEEN 0 AND 9),
	-- MQTT 5 Correlation Data, published with the message (and as the
	-- CloudEvents extension correlationdata): an answer to a command's
	-- request carries the command's. NULL: none.
	correlation_data BLOB
);

-- The relay's progress and the limits, in one row.
CREATE TABLE outbox_state (
	id                INTEGER PRIMARY KEY CHECK (id = 1),
	-- Every message up to sent_seq is settled (acknowledged or dead): the
	-- common mark, of every priority. A mark moves it up to the first
	-- pending row, or may leave it behind (never ahead).
	sent_seq          INTEGER NOT NULL DEFAULT 0,
	sent_at           INTEGER,
	max_pending_count INTEGER NOT NULL DEFAULT 0,
	max_pending_bytes INTEGER NOT NULL DEFAULT 0,
	-- The payload bytes of pending messages, kept only while a byte limit
	-- is set.
	pending_bytes     INTEGER NOT NULL DEFAULT 0,
	-- A new row is numbered above it: the newest seq ever deleted or ever
	-- marked (sent_seq_P). Numbers are never reused, and a row renumbered
	-- above max(seq_floor, sent_seq) is above every priority's mark.
	seq_floor         INTEGER NOT NULL DEFAULT 0,
	-- Sequence numbers above sent_seq that hold no pending message (dead
	-- rows, rows sent by their priority's mark, and the gaps deleted rows
	-- leave), kept only while a message limit is set: pending =
	-- max(max(seq), seq_floor, sent_seq) - sent_seq - skipped, without
	-- counting rows.
	skipped           INTEGER NOT NULL DEFAULT 0,
	-- The outbox clock that expiry is measured on: milliseconds of monotonic
	-- time during which an outbox ran on this database (downtime does not
	-- count), stored now and then by the relay, and by Enqueue and Close;
	-- it only grows, and a wall-clock jump cannot move it.
	clock_ms          INTEGER NOT NULL DEFAULT 0,
	-- The largest payload, in bytes, that an INSERT takes, whoever writes
	-- it; the relay parks a longer one, already stored, dead without
	-- reading it. Options.MaxPayloadBytes and outboxctl init set it.
	max_payload_bytes INTEGER NOT NULL DEFAULT 262144,
	-- The mark of each priority: every message of priority P up to
	-- sent_seq_P is settled. The relay publishes a priority in seq order,
	-- so one number per priority says what was sent ahead of sent_seq.
	sent_seq_0        INTEGER NOT NULL DEFAULT 0,
	sent_seq_1        INTEGER NOT NULL DEFAULT 0,
	sent_seq_2        INTEGER NOT NULL DEFAULT 0,
	sent_seq_3        INTEGER NOT NULL DEFAULT 0,
	sent_seq_4        INTEGER NOT NULL DEFAULT 0,
	sent_seq_5        INTEGER NOT NULL DEFAULT 0,
	sent_seq_6        INTEGER NOT NULL DEFAULT 0,
	sent_seq_7        INTEGER NOT NULL DEFAULT 0,
	sent_seq_8        INTEGER NOT NULL DEFAULT 0,
	sent_seq_9        INTEGER NOT NULL DEFAULT 0
);
INSERT INTO outbox_state (id) VALUES (1);

-- When each mark of a priority was recorded, for retention and
-- Record.SentAt: a row's sent_at is its priority's first entry at or above
-- its seq (the marked rows' seqs, so unique across priorities).
CREATE TABLE outbox_sent_log (
	seq      INTEGER PRIMARY KEY,
	sent_at  INTEGER NOT NULL,
	priority INTEGER NOT NULL DEFAULT 0
);

-- Which relay drains this database. The holder bumps token on every renewal;
-- host, machine_id, boot_id, pid, pid_start and pid_ns say where it runs, so
-- that a relay on the same host can tell at once that the holder is dead
-- (another boot, or its process gone) instead of waiting a whole TTL;
-- protocol is the MQTT version its connection speaks (NULL: not known);
-- broker_says is what the broker says of itself while it cannot take
-- messages, since broker_says_since (Unix ms; NULL: it takes them);
-- no_subscribers counts the messages the broker took with no subscriber
-- since the holder started, the last topic and when.
-- The row named 'relay.waiting' is a contender's announcement: its owner is
-- the last relay that waited for the lease, its token counts announcements.
CREATE TABLE outbox_lease (
	name       TEXT    PRIMARY KEY,
	owner      TEXT    NOT NULL DEFAULT '',
	token      INTEGER NOT NULL DEFAULT 0,
	expires_at INTEGER NOT NULL DEFAULT 0,
	host       TEXT    NOT NULL DEFAULT '',
	machine_id TEXT    NOT NULL DEFAULT '',
	boot_id    TEXT    NOT NULL DEFAULT '',
	pid        INTEGER NOT NULL DEFAULT 0,
	pid_start  INTEGER NOT NULL DEFAULT 0,
	pid_ns     TEXT    NOT NULL DEFAULT '',
	protocol   TEXT,
	broker_says       TEXT,
	broker_says_since INTEGER,
	no_subscribers       INTEGER,
	no_subscribers_topic TEXT,
	no_subscribers_at    INTEGER
);

-- The commands received (docs/commands.md), in arrival order (seq),
-- deduplicated by (source, id). The receiver inserts them; the application
-- applies one in a transaction that sets state 'applied' WHERE seq = ? AND
-- state = 'received' (1 row, or roll back) and inserts its answer into the
-- outbox. Times: received_at and done_at are Unix ms by the device's wall
-- clock, shown only; sent_at and deadline Unix ms by the sender's clock;
-- received_clock_ms and expires_at on the outbox clock (clock_ms), the only
-- ones judged; expires_at NULL: not known yet, or none. response_topic
-- NULL: no answer is sent.
CREATE TABLE outbox_command (
	seq               INTEGER PRIMARY KEY,
	id                TEXT    NOT NULL,
	source            TEXT    NOT NULL DEFAULT '',
	topic             TEXT    NOT NULL,
	type              TEXT    NOT NULL DEFAULT '',
	content_type      TEXT    NOT NULL DEFAULT '',
	data              BLOB    NOT NULL,
	response_topic    TEXT,
	correlation_data  BLOB,
	sent_at           INTEGER,
	deadline          INTEGER,
	received_at       INTEGER NOT NULL,
	received_clock_ms INTEGER NOT NULL,
	expires_at        INTEGER,
	state             TEXT    NOT NULL DEFAULT 'received' CHECK (state IN ('received', 'applied', 'expired', 'failed', 'malformed')),
	attempts          INTEGER NOT NULL DEFAULT 0,
	reason            TEXT,
	done_at           INTEGER,
	UNIQUE (source, id)
);

CREATE INDEX outbox_command_waiting ON outbox_command (seq) WHERE state = 'received';

CREATE INDEX outbox_dead ON outbox (seq) WHERE dead_at IS NOT NULL;

-- A UUIDv7 (NewID, or the SQL default) is unique by construction; only
-- other ids, chosen by the writer (business keys), cost an index entry.
CREATE UNIQUE INDEX outbox_chosen_id ON outbox (id)
WHERE NOT (length(id) = 36 AND substr(id, 15, 1) = '7' AND substr(id, 9, 1) = '-');

-- The next pending row of a priority above 0 is a seek here; so are the
-- counts of a priority. Rows of priority 0 are read by seq.
CREATE INDEX outbox_priority ON outbox (priority, seq) WHERE priority > 0 AND dead_at IS NULL;

-- A mark of a priority is one statement on outbox_state; these log when it
-- was made, one trigger per priority so that a mark runs only its own.
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

-- The work an insert needs only rarely, in this order (outbox_inserted
-- runs it through the view, so that its registers are set up only then):
--  0. What can never be delivered fails the statement: a topic with a
--     control character (U+0001-U+001F, U+007F-U+009F), a Unicode
--     noncharacter (U+FDD0-U+FDEF, U+xFFFE, U+xFFFF) or a leading '$'
--     (reserved for brokers), and a payload over max_payload_bytes. SQLite
--     has no regular expressions: GLOBs of code point ranges; the full
--     one runs only for a topic that holds a character in or near them.
--  1. A row numbered at or below what was sent or deleted (SQLite reuses the
--     number of a deleted newest row; a writer may set seq), or, here,
--     below a row that exists (a writer's seq into a gap), is moved above
--     every number used, so the relay, which only moves forward, cannot
--     pass it. With no limit set, a seq into a gap above the mark is left
--     to the relay, which finds it when it marks that range and moves it
--     the same way.
--  2. While a message limit is set, a writer's seq beyond the next leaves a
--     gap, counted as skipped.
--  3. The limits: a full outbox fails the statement, so the caller's
--     transaction rolls back; otherwise the bytes are counted. Rows ignored
--     by INSERT OR IGNORE or ON CONFLICT DO NOTHING never get here. A
--     pending row that INSERT OR REPLACE deletes on a connection without
--     recursive_triggers (SQLite fires no DELETE trigger for it) stays
--     counted, which only errs towards full, until the relay's mark drains
--     the outbox or the next Open counts again (recount.sql).
-- A row SQLite numbers itself is never moved below a number it gave before:
-- INSERT OR REPLACE numbers the new row above the one it deletes.
CREATE VIEW outbox_insert_checks AS SELECT 0 AS seq, 0 AS bytes, '' AS topic WHERE 0;

CREATE TRIGGER outbox_insert_checked INSTEAD OF INSERT ON outbox_insert_checks
BEGIN
	SELECT RAISE(ABORT, 'outbox: invalid topic: begins with $') WHERE NEW.topic GLOB '$*';
	SELECT RAISE(ABORT, 'outbox: invalid topic: control character or noncharacter')
	WHERE NEW.topic GLOB '*[' || char(1, 45, 31, 127, 45, 159, 64976, 45, 65007,
		65534, 45, 65535, 131070, 45, 131071, 196606, 45, 196607, 262142, 45, 262143, 327678, 45, 327679,
		393214, 45, 393215, 458750, 45, 458751, 524286, 45, 524287, 589822, 45, 589823, 655358, 45, 655359,
		720894, 45, 720895, 786430, 45, 786431, 851966, 45, 851967, 917502, 45, 917503, 983038, 45, 983039,
		1048574, 45, 1048575, 1114110, 45, 1114111) || ']*';
	SELECT RAISE(ABORT, 'outbox: payload too large') FROM outbox_state
	WHERE id = 1 AND NEW.bytes > max_payload_bytes;
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

-- The one trigger program every insert runs: without limits, with the
-- seq SQLite chose (the common case) and a printable ASCII topic, it reads
-- outbox_state and nothing else.
CREATE TRIGGER outbox_inserted AFTER INSERT ON outbox
WHEN (NEW.topic GLOB '*[^ -~]*' AND NEW.topic GLOB '*[' || char(1, 45, 31, 127, 45, 159, 64976, 45, 65007, 65534, 45, 1114111) || ']*')
	OR NEW.topic GLOB '$*'
	OR (SELECT NEW.seq <= seq_floor OR NEW.seq <= sent_seq OR max_pending_count > 0 OR max_pending_bytes > 0
		OR length(CAST(NEW.payload AS BLOB)) > max_payload_bytes FROM outbox_state WHERE id = 1)
BEGIN INSERT INTO outbox_insert_checks (seq, bytes, topic) VALUES (NEW.seq, length(CAST(NEW.payload AS BLOB)), NEW.topic); END;

-- A message parked dead (by the relay) or brought back in place leaves or
-- joins the pending count. A requeue moves the row to a new seq at the end:
-- its old number stays skipped, as a gap. A row at or below its priority's
-- mark is sent, not pending, dead or not: it is skipped either way.
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

-- An upsert that changes a pending payload changes the pending bytes.
CREATE TRIGGER outbox_payload_changed AFTER UPDATE OF payload ON outbox
WHEN OLD.dead_at IS NULL AND NEW.dead_at IS NULL
	AND (SELECT max_pending_bytes > 0 AND NEW.seq > sent_seq AND NEW.seq > CASE NEW.priority WHEN 0 THEN sent_seq_0 WHEN 1 THEN sent_seq_1 WHEN 2 THEN sent_seq_2 WHEN 3 THEN sent_seq_3 WHEN 4 THEN sent_seq_4 WHEN 5 THEN sent_seq_5 WHEN 6 THEN sent_seq_6 WHEN 7 THEN sent_seq_7 WHEN 8 THEN sent_seq_8 WHEN 9 THEN sent_seq_9 END FROM outbox_state WHERE id = 1)
BEGIN
	UPDATE outbox_state SET pending_bytes = max(pending_bytes - length(CAST(OLD.payload AS BLOB)) + length(CAST(NEW.payload AS BLOB)), 0)
	WHERE id = 1;
END;

CREATE TRIGGER outbox_newest_deleted BEFORE DELETE ON outbox
WHEN OLD.seq = (SELECT max(seq) FROM outbox)
BEGIN UPDATE outbox_state SET seq_floor = max(seq_floor, OLD.seq) WHERE id = 1; END;

-- The library deletes only sent and dead rows. A pending row deleted anyway
-- (by hand, or by INSERT OR REPLACE on a connection with recursive_triggers)
-- leaves the counts.
CREATE TRIGGER outbox_pending_deleted AFTER DELETE ON outbox
WHEN OLD.dead_at IS NULL
	AND (SELECT OLD.seq > sent_seq AND OLD.seq > CASE OLD.priority WHEN 0 THEN sent_seq_0 WHEN 1 THEN sent_seq_1 WHEN 2 THEN sent_seq_2 WHEN 3 THEN sent_seq_3 WHEN 4 THEN sent_seq_4 WHEN 5 THEN sent_seq_5 WHEN 6 THEN sent_seq_6 WHEN 7 THEN sent_seq_7 WHEN 8 THEN sent_seq_8 WHEN 9 THEN sent_seq_9 END AND (max_pending_count > 0 OR max_pending_bytes > 0) FROM outbox_state WHERE id = 1)
BEGIN
	UPDATE outbox_state SET
		skipped = CASE WHEN max_pending_count > 0 THEN skipped + 1 ELSE 0 END,
		pending_bytes = CASE WHEN max_pending_bytes > 0 THEN max(pending_bytes - length(CAST(OLD.payload AS BLOB)), 0) ELSE 0 END
	WHERE id = 1;
END;

-- Schema 1's columns, state and sent_at derived, for readers and tools;
-- since schema 5 state may also be 'expired', since schema 9 each row says
-- its priority.
CREATE VIEW outbox_messages AS
SELECT o.seq, o.id, o.topic, o.payload, o.type, o.content_type, o.created_at,
	CASE WHEN o.dead_at IS NOT NULL THEN CASE WHEN o.expired THEN 'expired' ELSE 'dead' END
		WHEN o.seq <= st.sent_seq OR o.seq <= CASE o.priority WHEN 0 THEN st.sent_seq_0 WHEN 1 THEN st.sent_seq_1 WHEN 2 THEN st.sent_seq_2 WHEN 3 THEN st.sent_seq_3 WHEN 4 THEN st.sent_seq_4 WHEN 5 THEN st.sent_seq_5 WHEN 6 THEN st.sent_seq_6 WHEN 7 THEN st.sent_seq_7 WHEN 8 THEN st.sent_seq_8 WHEN 9 THEN st.sent_seq_9 END THEN 'sent' ELSE 'pending' END AS state,
	o.attempts, o.last_error,
	CASE WHEN o.dead_at IS NULL AND (o.seq <= st.sent_seq OR o.seq <= CASE o.priority WHEN 0 THEN st.sent_seq_0 WHEN 1 THEN st.sent_seq_1 WHEN 2 THEN st.sent_seq_2 WHEN 3 THEN st.sent_seq_3 WHEN 4 THEN st.sent_seq_4 WHEN 5 THEN st.sent_seq_5 WHEN 6 THEN st.sent_seq_6 WHEN 7 THEN st.sent_seq_7 WHEN 8 THEN st.sent_seq_8 WHEN 9 THEN st.sent_seq_9 END)
		THEN (SELECT l.sent_at FROM outbox_sent_log l WHERE l.seq >= o.seq AND l.priority = o.priority ORDER BY l.seq LIMIT 1) END AS sent_at,
	o.dead_at, o.priority
FROM outbox o, outbox_state st WHERE st.id = 1;
