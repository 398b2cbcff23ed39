-- Issue 18 item 7 (decisions 0165, 0166): due age per lane and the declared drain.
-- The due age of a lane is the dispatch time of its oldest fire never attempted: one index-ordered
-- LIMIT 1 per lane over a partial index that holds only the fires waiting for their first attempt.
CREATE INDEX IF NOT EXISTS fires_never_attempted ON fires (lane, next_attempt_us)
  WHERE state = 'pending' AND dispatched_us IS NULL;
-- A declared drain (`fireledger drain start|stop`, audited): while one is in force (not ended, not
-- expired) the shipped page on the due age is suppressed. Rows are kept (the audit holds the acts).
CREATE TABLE drains (
  id TEXT PRIMARY KEY,
  started_us INTEGER NOT NULL,
  expires_us INTEGER NOT NULL,
  reason TEXT NOT NULL,
  actor TEXT NOT NULL,
  ended_us INTEGER,
  ended_by TEXT
);
CREATE INDEX drains_by_start ON drains (started_us);
