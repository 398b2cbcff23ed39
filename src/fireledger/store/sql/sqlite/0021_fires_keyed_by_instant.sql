-- Issue 15, session 6 (decision 0210): the fire and attempt rows are kept in order of their tenant
-- and instant, not of their trigger. Each write transaction on the fire path (commit, claim,
-- settlement) appends a whole page to the WAL per page it changes; keyed by trigger id first, every
-- fire of a cycle sat on its own leaf page (a trigger id is random), so a fire cost a page at each of
-- its three writes and its attempt a page at each of two. Keyed by (tenant, instant, trigger, seq),
-- a cycle's fires are neighbours. The same key was an index (fires_by_tenant_instant, every fire):
-- the table now is that order, and a trigger's history reads the new fires_by_trigger (written once,
-- at insert: its columns never change). A trigger's attempts are read through its fires. The copies
-- are made in the new key order (appends: packed pages, no random inserts on a large history).
CREATE TABLE fires_by_instant (
  tenant_id TEXT NOT NULL,
  trigger_id TEXT NOT NULL,
  scheduled_us INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  version INTEGER NOT NULL,
  kind TEXT NOT NULL,
  lane TEXT NOT NULL,
  state TEXT NOT NULL,
  cause TEXT,
  decided_us INTEGER NOT NULL,
  decided_by TEXT NOT NULL,
  dispatched_us INTEGER,
  finished_us INTEGER,
  tzdata_version TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  next_attempt_us INTEGER,
  lease_owner TEXT,
  lease_expires_us INTEGER,
  eps_us BIGINT,
  eps_source TEXT,
  attempt_base INTEGER NOT NULL DEFAULT 0,
  redriven_us INTEGER,
  specs TEXT,
  dst TEXT,
  PRIMARY KEY (tenant_id, scheduled_us, trigger_id, seq)
) WITHOUT ROWID;
INSERT INTO fires_by_instant (tenant_id, trigger_id, scheduled_us, seq, version, kind, lane, state, cause,
  decided_us, decided_by, dispatched_us, finished_us, tzdata_version, attempts, next_attempt_us, lease_owner,
  lease_expires_us, eps_us, eps_source, attempt_base, redriven_us, specs, dst)
SELECT tenant_id, trigger_id, scheduled_us, seq, version, kind, lane, state, cause,
  decided_us, decided_by, dispatched_us, finished_us, tzdata_version, attempts, next_attempt_us, lease_owner,
  lease_expires_us, eps_us, eps_source, attempt_base, redriven_us, specs, dst FROM fires
  ORDER BY tenant_id, scheduled_us, trigger_id, seq;
DROP TABLE fires;
ALTER TABLE fires_by_instant RENAME TO fires;
CREATE INDEX fires_by_trigger ON fires (tenant_id, trigger_id, scheduled_us, seq);
CREATE INDEX fires_undelivered ON fires (scheduled_us) WHERE state IN ('pending', 'dispatching');
CREATE INDEX fires_inflight ON fires (tenant_id, next_attempt_us) WHERE state = 'dispatching';
CREATE INDEX fires_held ON fires (tenant_id, trigger_id, scheduled_us) WHERE state = 'held';
CREATE INDEX fires_lane_tenant_due ON fires (lane, tenant_id, next_attempt_us)
  WHERE state IN ('pending', 'dispatching');
CREATE INDEX fires_dead_letters ON fires (tenant_id, scheduled_us, trigger_id, seq)
  WHERE state IN ('failed', 'unknown');
CREATE INDEX fires_never_attempted ON fires (lane, next_attempt_us)
  WHERE state = 'pending' AND dispatched_us IS NULL;
CREATE TABLE attempts_by_instant (
  tenant_id TEXT NOT NULL,
  trigger_id TEXT NOT NULL,
  scheduled_us INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  started_us INTEGER NOT NULL,
  finished_us INTEGER,
  result TEXT,
  http_status INTEGER,
  error TEXT,
  node TEXT NOT NULL,
  PRIMARY KEY (tenant_id, scheduled_us, trigger_id, seq, attempt)
) WITHOUT ROWID;
INSERT INTO attempts_by_instant (tenant_id, trigger_id, scheduled_us, seq, attempt, started_us, finished_us,
  result, http_status, error, node)
SELECT tenant_id, trigger_id, scheduled_us, seq, attempt, started_us, finished_us, result, http_status, error,
  node FROM attempts ORDER BY tenant_id, scheduled_us, trigger_id, seq, attempt;
DROP TABLE attempts;
ALTER TABLE attempts_by_instant RENAME TO attempts;
