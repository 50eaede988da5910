-- Inbox schema migration 2 (frozen), 1 -> 2: the dedupe window is measured on
-- the inbox clock, which wall-clock jumps cannot move; applied_at and
-- received_at stay for display. Existing rows get tick 0, the clock's value
-- as it is created here: they are kept one more full window, never purged
-- early by a wall-clock time written before the migration.

CREATE TABLE IF NOT EXISTS inbox_clock (
	id         INTEGER PRIMARY KEY CHECK (id = 1),
	elapsed_ms INTEGER NOT NULL
);
INSERT INTO inbox_clock (id, elapsed_ms) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
ALTER TABLE inbox ADD COLUMN applied_tick INTEGER NOT NULL DEFAULT 0;
ALTER TABLE inbox_quarantine ADD COLUMN received_tick INTEGER NOT NULL DEFAULT 0;
DROP INDEX IF EXISTS inbox_applied_at;
CREATE INDEX IF NOT EXISTS inbox_applied_tick ON inbox (applied_tick);
CREATE INDEX IF NOT EXISTS inbox_quarantine_received_tick ON inbox_quarantine (received_tick);
