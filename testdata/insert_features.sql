-- The outbox row's features one at a time, for BenchmarkInsertPath: each
-- table is the outbox table's columns and defaults with one more of what
-- schema/outbox.sql puts on them (the CHECK on topic, its two partial
-- indexes, the AFTER INSERT trigger whose WHEN reads outbox_state; the body
-- never runs here). Not the schema: a measuring copy, kept beside it.
CREATE TABLE wide (
	seq INTEGER PRIMARY KEY, id TEXT NOT NULL, topic TEXT NOT NULL, payload BLOB NOT NULL,
	type TEXT NOT NULL DEFAULT '', content_type TEXT NOT NULL DEFAULT '', created_at INTEGER NOT NULL DEFAULT 0,
	attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, dead_at INTEGER, expires_at INTEGER, expired INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE wide_checked (
	seq INTEGER PRIMARY KEY, id TEXT NOT NULL,
	topic TEXT NOT NULL CHECK (length(topic) > 0 AND instr(topic, '+') = 0 AND instr(topic, '#') = 0 AND instr(topic, char(0)) = 0),
	payload BLOB NOT NULL,
	type TEXT NOT NULL DEFAULT '', content_type TEXT NOT NULL DEFAULT '', created_at INTEGER NOT NULL DEFAULT 0,
	attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, dead_at INTEGER, expires_at INTEGER, expired INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE wide_indexed (
	seq INTEGER PRIMARY KEY, id TEXT NOT NULL, topic TEXT NOT NULL, payload BLOB NOT NULL,
	type TEXT NOT NULL DEFAULT '', content_type TEXT NOT NULL DEFAULT '', created_at INTEGER NOT NULL DEFAULT 0,
	attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, dead_at INTEGER, expires_at INTEGER, expired INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX wide_indexed_dead ON wide_indexed (seq) WHERE dead_at IS NOT NULL;
CREATE UNIQUE INDEX wide_indexed_chosen_id ON wide_indexed (id)
WHERE NOT (length(id) = 36 AND substr(id, 15, 1) = '7' AND substr(id, 9, 1) = '-');

CREATE TABLE wide_triggered (
	seq INTEGER PRIMARY KEY, id TEXT NOT NULL, topic TEXT NOT NULL, payload BLOB NOT NULL,
	type TEXT NOT NULL DEFAULT '', content_type TEXT NOT NULL DEFAULT '', created_at INTEGER NOT NULL DEFAULT 0,
	attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, dead_at INTEGER, expires_at INTEGER, expired INTEGER NOT NULL DEFAULT 0
);
CREATE TRIGGER wide_triggered_inserted AFTER INSERT ON wide_triggered
WHEN (SELECT NEW.seq <= seq_floor OR NEW.seq <= sent_seq OR max_pending_count > 0 OR max_pending_bytes > 0 FROM outbox_state WHERE id = 1)
BEGIN SELECT RAISE(ABORT, 'not measured'); END;
