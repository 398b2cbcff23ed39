-- Trust boundary (issue 7): the audit chain's head, append-only audit, principals by tenant,
-- verification errors, tenant purge bookkeeping and the non-identifying fire counts kept after it.
-- The head row is the chain's anchor (its last seq and hash) and, on PostgreSQL, its append lock.
CREATE TABLE audit_head (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  seq INTEGER NOT NULL,
  hash TEXT NOT NULL
);
INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');
CREATE INDEX audit_by_tenant ON audit (tenant_id, seq);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit table is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit table is append-only'); END;
CREATE INDEX principals_by_tenant ON principals (tenant_id, id);
ALTER TABLE targets ADD COLUMN verification_error TEXT;
ALTER TABLE tenants ADD COLUMN purged_us INTEGER;
-- Kept after a tenant is purged (billing): counts per UTC day (days since the epoch) and state.
CREATE TABLE fire_counts (
  tenant_id TEXT NOT NULL,
  day INTEGER NOT NULL,
  state TEXT NOT NULL,
  n INTEGER NOT NULL,
  PRIMARY KEY (tenant_id, day, state)
);
