-- Outbox schema migration 7 (frozen), 6 -> 7: what can never be delivered
-- is refused at INSERT, by every writer. The payload limit is stored, as the
-- pending limits are (Options.MaxPayloadBytes and outboxctl init set it),
-- and a topic with a control character (U+0001-U+001F, U+007F-U+009F), a
-- Unicode noncharacter (U+FDD0-U+FDEF, U+xFFFE and U+xFFFF) or a leading
-- '$' (MQTT reserves those for brokers) is refused: a broker closes the
-- connection on the former, and refuses the latter, every time. SQLite has
-- no regular expressions: GLOBs of code point ranges say it. The one every
-- insert runs stops at the first character outside printable ASCII (most
-- topics have none), the next looks for one in or near the ranges, and
-- only then does the full one run.
--
-- Rows already stored that break the new rules stay as they are: the relay
-- parks them dead at their turn, with the reason, without loading a payload
-- over the limit. So that an upgrade never parks what was accepted before,
-- the limit starts at the default (256 KiB) or, if larger, the largest
-- payload waiting to be sent, up to MaxPayloadBytesLimit.

ALTER TABLE outbox_state ADD COLUMN max_payload_bytes INTEGER NOT NULL DEFAULT 262144;
UPDATE outbox_state SET max_payload_bytes = max(max_payload_bytes, coalesce((SELECT max(octet_length(payload)) FROM outbox
	WHERE seq > outbox_state.sent_seq AND dead_at IS NULL AND octet_length(payload) <= 199229440), 0))
WHERE id = 1;

DROP TRIGGER outbox_inserted;
DROP TRIGGER outbox_insert_checked;
DROP VIEW outbox_insert_checks;

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

CREATE TRIGGER outbox_inserted AFTER INSERT ON outbox
WHEN (NEW.topic GLOB '*[^ -~]*' AND NEW.topic GLOB '*[' || char(1, 45, 31, 127, 45, 159, 64976, 45, 65007, 65534, 45, 1114111) || ']*')
	OR NEW.topic GLOB '$*'
	OR (SELECT NEW.seq <= seq_floor OR NEW.seq <= sent_seq OR max_pending_count > 0 OR max_pending_bytes > 0
		OR length(CAST(NEW.payload AS BLOB)) > max_payload_bytes FROM outbox_state WHERE id = 1)
BEGIN INSERT INTO outbox_insert_checks (seq, bytes, topic) VALUES (NEW.seq, length(CAST(NEW.payload AS BLOB)), NEW.topic); END;
