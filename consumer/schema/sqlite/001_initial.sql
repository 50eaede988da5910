-- Inbox schema migration 1 (frozen): applied events, keyed by (source, id), and
-- quarantined messages.

CREATE TABLE IF NOT EXISTS inbox (
	source     TEXT    NOT NULL,
	id         TEXT    NOT NULL,
	type       TEXT    NOT NULL DEFAULT '',
	sequence   INTEGER NOT NULL DEFAULT 0,
	applied_at INTEGER NOT NULL,
	PRIMARY KEY (source, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_applied_at ON inbox (applied_at);

CREATE TABLE IF NOT EXISTS inbox_quarantine (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	topic       TEXT    NOT NULL,
	payload     BLOB    NOT NULL,
	reason      TEXT    NOT NULL,
	received_at INTEGER NOT NULL
);
