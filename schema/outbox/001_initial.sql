-- Outbox schema migration 1 (frozen: this is what version 1 databases ran).
-- The outbox table with a state per row, its counters and the relay lease.

CREATE TABLE IF NOT EXISTS outbox (
	seq          INTEGER PRIMARY KEY AUTOINCREMENT,
	id           TEXT    NOT NULL UNIQUE DEFAULT (lower(printf('%08x-%04x-7%03x-%04x-%012x', CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) / 65536, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) % 65536, random() & 4095, 32768 | (random() & 16383), random() & 281474976710655))),
	topic        TEXT    NOT NULL CHECK (length(topic) > 0 AND instr(topic, '+') = 0 AND instr(topic, '#') = 0 AND instr(topic, char(0)) = 0),
	payload      BLOB    NOT NULL,
	type         TEXT    NOT NULL DEFAULT '',
	content_type TEXT    NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)),
	state        TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
	attempts     INTEGER NOT NULL DEFAULT 0,
	last_error   TEXT,
	sent_at      INTEGER,
	dead_at      INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (seq) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS outbox_dead ON outbox (seq) WHERE state = 'dead';
CREATE INDEX IF NOT EXISTS outbox_sent ON outbox (sent_at) WHERE state = 'sent';

CREATE TABLE IF NOT EXISTS outbox_counters (
	id                INTEGER PRIMARY KEY CHECK (id = 1),
	pending_count     INTEGER NOT NULL DEFAULT 0,
	pending_bytes     INTEGER NOT NULL DEFAULT 0,
	max_pending_count INTEGER NOT NULL DEFAULT 0,
	max_pending_bytes INTEGER NOT NULL DEFAULT 0
);
INSERT OR IGNORE INTO outbox_counters (id) VALUES (1);

CREATE TRIGGER IF NOT EXISTS outbox_capacity BEFORE INSERT ON outbox
WHEN (SELECT (max_pending_count > 0 AND pending_count >= max_pending_count)
          OR (max_pending_bytes > 0 AND pending_bytes + length(CAST(NEW.payload AS BLOB)) > max_pending_bytes)
      FROM outbox_counters WHERE id = 1)
BEGIN SELECT RAISE(ABORT, 'outbox full: pending limit reached'); END;

CREATE TRIGGER IF NOT EXISTS outbox_count_insert AFTER INSERT ON outbox WHEN NEW.state = 'pending'
BEGIN UPDATE outbox_counters SET pending_count = pending_count + 1,
	pending_bytes = pending_bytes + length(CAST(NEW.payload AS BLOB)) WHERE id = 1; END;

CREATE TRIGGER IF NOT EXISTS outbox_count_leave AFTER UPDATE OF state ON outbox
WHEN OLD.state = 'pending' AND NEW.state <> 'pending'
BEGIN UPDATE outbox_counters SET pending_count = pending_count - 1,
	pending_bytes = pending_bytes - length(CAST(OLD.payload AS BLOB)) WHERE id = 1; END;

CREATE TRIGGER IF NOT EXISTS outbox_count_enter AFTER UPDATE OF state ON outbox
WHEN OLD.state <> 'pending' AND NEW.state = 'pending'
BEGIN UPDATE outbox_counters SET pending_count = pending_count + 1,
	pending_bytes = pending_bytes + length(CAST(NEW.payload AS BLOB)) WHERE id = 1; END;

CREATE TRIGGER IF NOT EXISTS outbox_count_delete AFTER DELETE ON outbox WHEN OLD.state = 'pending'
BEGIN UPDATE outbox_counters SET pending_count = pending_count - 1,
	pending_bytes = pending_bytes - length(CAST(OLD.payload AS BLOB)) WHERE id = 1; END;

CREATE TABLE IF NOT EXISTS outbox_lease (
	name       TEXT    PRIMARY KEY,
	owner      TEXT    NOT NULL DEFAULT '',
	token      INTEGER NOT NULL DEFAULT 0,
	expires_at INTEGER NOT NULL DEFAULT 0
);
