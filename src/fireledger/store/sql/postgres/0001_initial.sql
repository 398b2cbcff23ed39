-- fireledger schema v1 (PostgreSQL). Instants are INTEGER microseconds since the Unix epoch (UTC).
-- The registry (tenants … trigger_versions) and the ledger (fires, attempts, work_outcomes) are the
-- systems of record; due, leases and nodes are rebuildable projections.
CREATE TABLE tenants (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  created_us BIGINT NOT NULL,
  deleted_us BIGINT,
  quota_fires_per_s DOUBLE PRECISION NOT NULL DEFAULT 100,
  quota_inflight BIGINT NOT NULL DEFAULT 100,
  catchup_fraction DOUBLE PRECISION NOT NULL DEFAULT 0.1,
  wrapped_key BYTEA
);
CREATE TABLE principals (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  name TEXT NOT NULL,
  token_hash TEXT NOT NULL UNIQUE,
  roles TEXT NOT NULL,
  created_us BIGINT NOT NULL,
  revoked_us BIGINT
);
CREATE TABLE targets (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  kind TEXT NOT NULL,
  url TEXT,
  secret TEXT NOT NULL,
  verification_state TEXT NOT NULL,
  verification_token TEXT NOT NULL,
  verified_us BIGINT,
  verification_expires_us BIGINT,
  created_us BIGINT NOT NULL,
  deleted_us BIGINT
);
CREATE INDEX targets_by_tenant ON targets (tenant_id, id);
CREATE TABLE triggers (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  name TEXT NOT NULL,
  state TEXT NOT NULL,
  current_version BIGINT NOT NULL,
  partition BIGINT NOT NULL,
  created_us BIGINT NOT NULL,
  updated_us BIGINT NOT NULL,
  paused_us BIGINT
);
CREATE INDEX triggers_by_tenant ON triggers (tenant_id, id);
CREATE TABLE trigger_versions (
  trigger_id TEXT NOT NULL REFERENCES triggers(id),
  version BIGINT NOT NULL,
  tenant_id TEXT NOT NULL,
  schedule TEXT NOT NULL,
  target_id TEXT NOT NULL,
  payload BYTEA NOT NULL,
  policies TEXT NOT NULL,
  tzdata_version TEXT NOT NULL,
  created_us BIGINT NOT NULL,
  PRIMARY KEY (trigger_id, version)
);
CREATE TABLE due (
  trigger_id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  partition BIGINT NOT NULL,
  next_us BIGINT NOT NULL,
  version BIGINT NOT NULL
);
CREATE INDEX due_by_partition_instant ON due (partition, next_us);
CREATE INDEX due_by_instant ON due (next_us);
CREATE TABLE fires (
  tenant_id TEXT NOT NULL,
  trigger_id TEXT NOT NULL,
  scheduled_us BIGINT NOT NULL,
  seq BIGINT NOT NULL,
  version BIGINT NOT NULL,
  kind TEXT NOT NULL,
  lane TEXT NOT NULL,
  state TEXT NOT NULL,
  cause TEXT,
  decided_us BIGINT NOT NULL,
  decided_by TEXT NOT NULL,
  dispatched_us BIGINT,
  finished_us BIGINT,
  tzdata_version TEXT NOT NULL,
  attempts BIGINT NOT NULL DEFAULT 0,
  next_attempt_us BIGINT,
  lease_owner TEXT,
  lease_expires_us BIGINT,
  PRIMARY KEY (tenant_id, trigger_id, scheduled_us, seq)
);
-- Live fires only (pending / dispatching), ordered for the dispatch plane's claim.
CREATE INDEX fires_dispatchable ON fires (lane, next_attempt_us) WHERE state IN ('pending', 'dispatching');
-- The oldest undelivered instant (the paging signal).
CREATE INDEX fires_undelivered ON fires (scheduled_us) WHERE state IN ('pending', 'dispatching');
CREATE TABLE attempts (
  tenant_id TEXT NOT NULL,
  trigger_id TEXT NOT NULL,
  scheduled_us BIGINT NOT NULL,
  seq BIGINT NOT NULL,
  attempt BIGINT NOT NULL,
  started_us BIGINT NOT NULL,
  finished_us BIGINT,
  result TEXT,
  http_status BIGINT,
  error TEXT,
  node TEXT NOT NULL,
  PRIMARY KEY (tenant_id, trigger_id, scheduled_us, seq, attempt)
);
CREATE TABLE work_outcomes (
  tenant_id TEXT NOT NULL,
  trigger_id TEXT NOT NULL,
  scheduled_us BIGINT NOT NULL,
  seq BIGINT NOT NULL,
  outcome TEXT NOT NULL,
  reported_us BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, trigger_id, scheduled_us, seq)
);
CREATE TABLE leases (
  partition INTEGER PRIMARY KEY,
  owner TEXT,
  epoch BIGINT NOT NULL DEFAULT 0,
  expires_us BIGINT NOT NULL DEFAULT 0,
  eps_us BIGINT
);
CREATE TABLE nodes (
  id TEXT PRIMARY KEY,
  role TEXT NOT NULL,
  started_us BIGINT NOT NULL,
  heartbeat_us BIGINT NOT NULL,
  eps_us BIGINT,
  eps_source TEXT
);
CREATE TABLE audit (
  seq BIGSERIAL PRIMARY KEY,
  tenant_id TEXT,
  actor TEXT NOT NULL,
  action TEXT NOT NULL,
  at_us BIGINT NOT NULL,
  prior TEXT,
  new TEXT,
  prev_hash TEXT NOT NULL,
  hash TEXT NOT NULL
);
CREATE TABLE signals (
  name TEXT PRIMARY KEY,
  counter BIGINT NOT NULL
);
INSERT INTO signals (name, counter) VALUES ('definitions', 0);
