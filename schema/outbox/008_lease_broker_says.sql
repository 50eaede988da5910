-- Outbox schema migration 8 (frozen), 7 -> 8: the lease says what the
-- broker says of itself while it says it cannot take messages (busy, quota
-- exceeded, shutting down; NULL otherwise) and since when (Unix ms), so
-- that `outboxctl status`, in another process, can show it. Written when it
-- changes, not per message.

ALTER TABLE outbox_lease ADD COLUMN broker_says TEXT;
ALTER TABLE outbox_lease ADD COLUMN broker_says_since INTEGER;
