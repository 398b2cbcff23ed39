-- The multi-node timing plane (issue 4): partition leases held by node sessions, the partition
-- count, the shadow rebuilder's report, and the resume point of a trigger. Instants are INTEGER
-- microseconds since the Unix epoch (UTC). See docs/decisions/0020-0024.
--
-- leases: one row per partition. `rev` is bumped by every change (grant, renewal, release), so a
-- grant is a compare-and-set on what the granter read. `handoff_to` names the node a released
-- partition is offered to first. `takeover_us`/`takeover_cause` measure the last handover.
ALTER TABLE leases ADD COLUMN rev INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN granted_us INTEGER;
ALTER TABLE leases ADD COLUMN renewed_us INTEGER;
ALTER TABLE leases ADD COLUMN released_us INTEGER;
ALTER TABLE leases ADD COLUMN prev_owner TEXT;
ALTER TABLE leases ADD COLUMN handoff_to TEXT;
ALTER TABLE leases ADD COLUMN takeover_us INTEGER;
ALTER TABLE leases ADD COLUMN takeover_cause TEXT;
CREATE INDEX leases_by_owner ON leases (owner);
-- nodes: the session of each timing node (heartbeat_us is its renewal); `shedding` is 1 while its
-- clock bound is over the ceiling; `stopped_us` is set by a clean shutdown.
ALTER TABLE nodes ADD COLUMN shedding INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN stopped_us INTEGER;
-- triggers: when the trigger was last resumed (the due index restarts from there).
ALTER TABLE triggers ADD COLUMN resumed_us INTEGER;
CREATE INDEX triggers_by_partition ON triggers (partition, id);
-- timing_settings: the partition count of the keyspace (changed by `fireledger partitions set`).
CREATE TABLE timing_settings (
  name TEXT PRIMARY KEY,
  value INTEGER NOT NULL
);
INSERT INTO timing_settings (name, value) VALUES ('partitions', 256);
-- shadow_partitions: the shadow rebuilder's latest report per partition (claimed_us orders the rota).
CREATE TABLE shadow_partitions (
  partition INTEGER PRIMARY KEY,
  claimed_us INTEGER NOT NULL DEFAULT 0,
  reported_us INTEGER,
  node TEXT,
  triggers INTEGER NOT NULL DEFAULT 0,
  live_rows INTEGER NOT NULL DEFAULT 0,
  divergent INTEGER NOT NULL DEFAULT 0,
  missing INTEGER NOT NULL DEFAULT 0,
  orphaned INTEGER NOT NULL DEFAULT 0,
  wrong_instant INTEGER NOT NULL DEFAULT 0,
  wrong_version INTEGER NOT NULL DEFAULT 0,
  wrong_partition INTEGER NOT NULL DEFAULT 0,
  repartition_pending INTEGER NOT NULL DEFAULT 0,
  duration_us INTEGER
);
-- shadow_divergence: each divergent row of the latest report (trigger ids and instants only).
CREATE TABLE shadow_divergence (
  partition INTEGER NOT NULL,
  trigger_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  live_next_us INTEGER,
  live_version INTEGER,
  expected_next_us INTEGER,
  expected_version INTEGER,
  reported_us INTEGER NOT NULL,
  node TEXT NOT NULL,
  PRIMARY KEY (partition, trigger_id)
);
