-- The dispatch plane (issue 5): rate buckets for lanes and tenant quotas, tenant-owned queues,
-- and the replay guard of signed outcome callbacks. Instants are INTEGER microseconds (UTC).
--
-- rate_buckets: one GCRA state per key ('lane:<lane>', 'quota:<tenant>', 'catch-up:<tenant>',
-- 'backfill:<tenant>'): the theoretical arrival time of the next conforming attempt. Rates come
-- from the configuration and the tenants table at claim time, so a quota change applies at once.
CREATE TABLE rate_buckets (
  key TEXT PRIMARY KEY,
  tat_us INTEGER NOT NULL
);
-- queue_messages: one row per fire delivered to a `queue` target, until a consumer acks it. The row
-- references the fire (no payload here: the payload stays in the registry and is read at pull).
CREATE TABLE queue_messages (
  tenant_id TEXT NOT NULL,
  trigger_id TEXT NOT NULL,
  scheduled_us INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  target_id TEXT NOT NULL,
  enqueued_us INTEGER NOT NULL,
  visible_us INTEGER NOT NULL,
  receives INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, trigger_id, scheduled_us, seq)
);
CREATE INDEX queue_messages_visible ON queue_messages (target_id, visible_us, scheduled_us);
-- callback_receipts: webhook-ids of accepted outcome callbacks, kept for the replay window.
CREATE TABLE callback_receipts (
  target_id TEXT NOT NULL,
  msg_id TEXT NOT NULL,
  seen_us INTEGER NOT NULL,
  PRIMARY KEY (target_id, msg_id)
);
CREATE INDEX callback_receipts_age ON callback_receipts (seen_us);
-- The fair claim ranks live fires per lane, tenant and trigger (oldest first within a trigger).
CREATE INDEX fires_lane_fair ON fires (lane, tenant_id, trigger_id, scheduled_us)
  WHERE state IN ('pending', 'dispatching');
-- A tenant's attempts in flight across every dispatch process (its in-flight quota).
CREATE INDEX fires_inflight ON fires (tenant_id, next_attempt_us) WHERE state = 'dispatching';
