-- fireledger schema v1 (SQLite). Instants are INTEGER microseconds since the Unix epoch (UTC).
-- The registry (tenants … trigger_versions) and the ledger (fires, attempts, work_outcomes) are the
-- systems of record; due, leases and nodes are rebuildable projections.
CREATE TABLE tenants (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  created_us INTEGER NOT NULL,
  deleted_us INTEGER,
  quota_fires_per_s REAL NOT NULL DEFAULT 100,
  quota_inflight INTEGER NOT NULL DEFAULT 100,
  catchup_fraction REAL NOT NULL DEFAULT 0.1,
  wrapped_key BLOB
);
CREATE TABLE principals (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  name TEXT NOT NULL,
  token_hash TEXT NOT NULL UNIQUE,
  roles TEXT NOT NULL,
  created_us INTEGER NOT NULL,
  revoked_us INTEGER
);
CREATE TABLE targets (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  kind TEXT NOT NULL,
  url TEXT,
  secret TEXT NOT NULL,
  verification_state TEXT NOT NULL,
  verification_token TEXT NOT NULL,
  verified_us INTEGER,
  verification_expires_us INTEGER,
  created_us INTEGER NOT NULL,
  deleted_us INTEGER
);
CREATE INDEX targets_by_tenant ON targets (tenant_id, id);
CREATE TABLE triggers (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  name TEXT NOT NULL,
  state TEXT NOT NULL,
  current_version INTEGER NOT NULL,
  partition INTEGER NOT NULL,
  created_us INTEGER NOT NULL,
  updated_us INTEGER NOT NULL,
  paused_us INTEGER
);
CREATE INDEX triggers_by_tenant ON triggers (tenant_id, id);
CREATE TABLE trigger_versions (
  trigger_id TEXT NOT NULL REFERENCES triggers(id),
  version INTEGER NOT NULL,
  tenant_id TEXT NOT NULL,
  schedule TEXT NOT NULL,
  target_id TEXT NOT NULL,
  payload BLOB NOT NULL,
  policies TEXT NOT NULL,
  tzdata_version TEXT NOT NULL,
  created_us INTEGER NOT NULL,
  PRIMARY KEY (trigger_id, version)
);
CREATE TABLE due (
  trigger_id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  partition INTEGER NOT NULL,
  next_us INTEGER NOT NULL,
  version INTEGER NOT NULL
);
CREATE INDEX due_by_partition_instant ON due (partition, next_us);
CREATE INDEX due_by_instant ON due (next_us);
CREATE TABLE fires (
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
  PRIMARY KEY (tenant_id, trigger_id, scheduled_us, seq)
) WITHOUT ROWID;
-- Live fires only (pending / dispatching), ordered for the dispatch plane's claim.
CREATE INDEX fires_dispatchable ON fires (lane, next_attempt_us) WHERE state IN ('pending', 'dispatching');
-- The oldest undelivered instant (the paging signal).
CREATE INDEX fires_undelivered ON fires (scheduled_us) WHERE state IN ('pending', 'dispatching');
CREATE TABLE attempts (
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
  PRIMARY KEY (tenant_id, trigger_id, scheduled_us, seq, attempt)
) WITHOUT ROWID;
CREATE TABLE work_outcomes (
  tenant_id TEXT NOT NULL,
  trigger_id TEXT NOT NULL,
  scheduled_us INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  outcome TEXT NOT NULL,
  reported_us INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, trigger_id, scheduled_us, seq)
) WITHOUT ROWID;
CREATE TABLE leases (
  partition INTEGER PRIMARY KEY,
  owner TEXT,
  epoch INTEGER NOT NULL DEFAULT 0,
  expires_us INTEGER NOT NULL DEFAULT 0,
  eps_us INTEGER
);
CREATE TABLE nodes (
  id TEXT PRIMARY KEY,
  role TEXT NOT NULL,
  started_us INTEGER NOT NULL,
  heartbeat_us INTEGER NOT NULL,
  eps_us INTEGER,
  eps_source TEXT
);
CREATE TABLE audit (
  seq INTEGER PRIMARY KEY,
  tenant_id TEXT,
  actor TEXT NOT NULL,
  action TEXT NOT NULL,
  at_us INTEGER NOT NULL,
  prior TEXT,
  new TEXT,
  prev_hash TEXT NOT NULL,
  hash TEXT NOT NULL
);
CREATE TABLE signals (
  name TEXT PRIMARY KEY,
  counter INTEGER NOT NULL
);
INSERT INTO signals (name, counter) VALUES ('definitions', 0);
