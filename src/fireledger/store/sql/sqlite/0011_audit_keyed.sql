-- Keyed audit chain (issue 13, decision 0090). Rows are now linked by HMAC-SHA256 under a key derived
-- from the KEK (outside the database); applying this migration also appends one keyed `audit.seal`
-- row over any older, unkeyed rows (done by the program in this migration's transaction).
-- The table keeps refusing UPDATE/DELETE (0004); the head may now only advance by one row at a time,
-- may not be deleted, and a row may only be inserted at the head: rewriting needs DDL rights.
CREATE TRIGGER audit_head_no_delete BEFORE DELETE ON audit_head
BEGIN SELECT RAISE(ABORT, 'the audit head only advances'); END;
CREATE TRIGGER audit_head_advances BEFORE UPDATE ON audit_head
WHEN NEW.id <> OLD.id OR NEW.seq <> OLD.seq + 1
BEGIN SELECT RAISE(ABORT, 'the audit head only advances, one row at a time'); END;
CREATE TRIGGER audit_insert_at_head BEFORE INSERT ON audit
WHEN NEW.seq IS NOT (SELECT seq FROM audit_head WHERE id = 1) + 1
BEGIN SELECT RAISE(ABORT, 'an audit row is only appended at the head'); END;
