-- Outbox schema migration 5 (frozen), 4 -> 5: message expiry.
-- outbox.expires_at is when a message expires, on the outbox clock
-- (outbox_state.clock_ms: milliseconds of monotonic time during which this
-- database's outbox ran, stored now and then; a wall-clock jump cannot move
-- it); NULL means never. A message whose time is up at its turn is parked,
-- not published: dead_at set, as for a dead message (so it leaves the
-- pending counters the same way), and expired = 1, which tells it apart.
-- Existing rows have no expiry.

ALTER TABLE outbox ADD COLUMN expires_at INTEGER;
ALTER TABLE outbox ADD COLUMN expired INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_state ADD COLUMN clock_ms INTEGER NOT NULL DEFAULT 0;

DROP VIEW outbox_messages;
CREATE VIEW outbox_messages AS
SELECT o.seq, o.id, o.topic, o.payload, o.type, o.content_type, o.created_at,
	CASE WHEN o.dead_at IS NOT NULL THEN CASE WHEN o.expired THEN 'expired' ELSE 'dead' END
		WHEN o.seq <= st.sent_seq THEN 'sent' ELSE 'pending' END AS state,
	o.attempts, o.last_error,
	CASE WHEN o.dead_at IS NULL AND o.seq <= st.sent_seq
		THEN (SELECT l.sent_at FROM outbox_sent_log l WHERE l.seq >= o.seq ORDER BY l.seq LIMIT 1) END AS sent_at,
	o.dead_at
FROM outbox o, outbox_state st WHERE st.id = 1;
