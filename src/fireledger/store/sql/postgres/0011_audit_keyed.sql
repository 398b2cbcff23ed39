-- Keyed audit chain (issue 13, decision 0090). Rows are now linked by HMAC-SHA256 under a key derived
-- from the KEK (outside the database); applying this migration also appends one keyed `audit.seal`
-- row over any older, unkeyed rows (done by the program in this migration's transaction).
-- The table keeps refusing UPDATE/DELETE/TRUNCATE (0004); the head may now only advance by one row at
-- a time, may not be deleted or truncated, and a row may only be inserted at the head: rewriting needs
-- DDL rights (or a superuser).
CREATE FUNCTION audit_head_advances() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' OR NEW.id <> OLD.id OR NEW.seq <> OLD.seq + 1 THEN
    RAISE EXCEPTION 'the audit head only advances, one row at a time';
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER audit_head_advances BEFORE UPDATE OR DELETE ON audit_head
  FOR EACH ROW EXECUTE FUNCTION audit_head_advances();
CREATE TRIGGER audit_head_no_truncate BEFORE TRUNCATE ON audit_head
  FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only();
CREATE FUNCTION audit_insert_at_head() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.seq IS DISTINCT FROM (SELECT seq FROM audit_head WHERE id = 1) + 1 THEN
    RAISE EXCEPTION 'an audit row is only appended at the head';
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER audit_insert_at_head BEFORE INSERT ON audit
  FOR EACH ROW EXECUTE FUNCTION audit_insert_at_head();
