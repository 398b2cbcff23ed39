-- Issue 17 item 3 (decisions 0170-0174): verification that does not lapse silently, and DNS TXT as a
-- second method. verification_method is how the target's verification was proved ('http' or 'dns';
-- NULL: never proved, or proved before this migration, which was over http). reverify_after_us is the
-- per-target claim of the automatic re-verification: a control process takes a target whose
-- verification enters its last 7 days by moving this instant forward (compare-and-set), so however
-- many control processes run, one re-verifies each target, and a failed try waits until then.
ALTER TABLE targets ADD COLUMN verification_method TEXT;
ALTER TABLE targets ADD COLUMN reverify_after_us INTEGER;
UPDATE targets SET verification_method = 'http' WHERE verification_state = 'verified' AND kind = 'http';
CREATE INDEX IF NOT EXISTS targets_verified_by_expiry ON targets (verification_expires_us)
  WHERE verification_state = 'verified' AND deleted_us IS NULL;
