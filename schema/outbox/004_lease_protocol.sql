-- Outbox schema migration 4 (frozen), 3 -> 4: the lease says which MQTT
-- version its holder's connection speaks ('5' or '3.1.1'; NULL while not
-- known), so that `outboxctl status`, in another process, can show it.

ALTER TABLE outbox_lease ADD COLUMN protocol TEXT;
