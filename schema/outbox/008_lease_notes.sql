-- Outbox schema migration 8 (frozen), 7 -> 8: the lease holds what its
-- holder has to tell another process's `outboxctl status`: what the broker
-- says of itself while it says it cannot take messages (busy, quota
-- exceeded, shutting down; NULL otherwise) and since when (Unix ms), and
-- how many messages the broker took with no subscriber (MQTT 5 PUBACK 0x10)
-- since the holder started, the last topic and when. Written when they
-- change, at most once a minute per topic for the latter, never per message.

ALTER TABLE outbox_lease ADD COLUMN broker_says TEXT;
ALTER TABLE outbox_lease ADD COLUMN broker_says_since INTEGER;
ALTER TABLE outbox_lease ADD COLUMN no_subscribers INTEGER;
ALTER TABLE outbox_lease ADD COLUMN no_subscribers_topic TEXT;
ALTER TABLE outbox_lease ADD COLUMN no_subscribers_at INTEGER;
