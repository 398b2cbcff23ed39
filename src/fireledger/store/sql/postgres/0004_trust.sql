-- Trust boundary (issue 7): the audit chain's head, append-only audit, principals by tenant,
-- verification errors, tenant purge bookkeeping and the non-identifying fire counts kept after it.
-- The head row is the chain's anchor (its last seq and hash) and, on PostgreSQL, its append lock.
CREATE TABLE audit_head (
  id BIGINT PRIMARY KEY CHECK (id = 1),
  seq BIGINT NOT NULL,
  hash TEXT NOT NULL
);
INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');
CREATE INDEX audit_by_tenant ON audit (tenant_id, seq);
CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'the audit table is append-only';
END
$$;
CREATE TRIGGER audit_no_update BEFORE UPDATE OR DELETE ON audit
  FOR EACH ROW EXECUTE FUNCTION audit_append_only();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
  FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();
CREATE INDEX principals_by_tenant ON principals (tenant_id, id);
ALTER TABLE targets ADD COLUMN verification_error TEXT;
ALTER TABLE tenants ADD COLUMN purged_us BIGINT;
-- Kept after a tenant is purged (billing): counts per UTC day (days since the epoch) and state.
CREATE TABLE fire_counts (
  tenant_id TEXT NOT NULL,
  day BIGINT NOT NULL,
  state TEXT NOT NULL,
  n BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, day, state)
);
