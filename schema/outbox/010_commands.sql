-- Outbox schema migration 10 (frozen), 9 -> 10: commands to the device.
-- An outbox row may carry MQTT 5 Correlation Data (an answer to a
-- command's request); NULL: none. outbox_command holds the commands
-- received, in arrival order (seq), deduplicated by (source, id): the
-- receiver inserts them, the application applies them (state 'received'
-- to 'applied', with its answer in the outbox, in one transaction), the
-- receiver or the application expires stale ones. Times: received_at and
-- done_at are Unix ms by the device's wall clock, shown only; sent_at and
-- deadline Unix ms by the sender's clock; received_clock_ms and expires_at
-- on the outbox clock (outbox_state.clock_ms), the only ones judged.

ALTER TABLE outbox ADD COLUMN correlation_data BLOB;

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
