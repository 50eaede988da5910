-- Inbox schema migration 2 (frozen), 1 -> 2, PostgreSQL: the inbox clock, as
-- schema/inbox/002_inbox_clock.sql. The clock row is shared by every
-- consumer on the database; they write it rarely (see inbox.go).

CREATE TABLE IF NOT EXISTS inbox_clock (
	id         INTEGER PRIMARY KEY CHECK (id = 1),
	elapsed_ms BIGINT  NOT NULL
);
INSERT INTO inbox_clock (id, elapsed_ms) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
ALTER TABLE inbox ADD COLUMN IF NOT EXISTS applied_tick BIGINT NOT NULL DEFAULT 0;
ALTER TABLE inbox_quarantine ADD COLUMN IF NOT EXISTS received_tick BIGINT NOT NULL DEFAULT 0;
DROP INDEX IF EXISTS inbox_applied_at;
CREATE INDEX IF NOT EXISTS inbox_applied_tick ON inbox (applied_tick);
CREATE INDEX IF NOT EXISTS inbox_quarantine_received_tick ON inbox_quarantine (received_tick);
