-- Issue 15, session 6 (decision 0210): the fire and attempt keys lead with the tenant and the
-- instant, not the trigger (SQLite keeps the rows in key order: a cycle's fires become neighbours
-- instead of one leaf page each). Here the heap is already in insertion order; the primary-key
-- index changes the same way, so its inserts land on the right edge instead of a random leaf, and it
-- replaces fires_by_tenant_instant (the same columns). A trigger's history reads fires_by_trigger.
ALTER TABLE fires DROP CONSTRAINT fires_pkey;
ALTER TABLE fires ADD PRIMARY KEY (tenant_id, scheduled_us, trigger_id, seq);
DROP INDEX IF EXISTS fires_by_tenant_instant;
CREATE INDEX fires_by_trigger ON fires (tenant_id, trigger_id, scheduled_us, seq);
ALTER TABLE attempts DROP CONSTRAINT attempts_pkey;
ALTER TABLE attempts ADD PRIMARY KEY (tenant_id, scheduled_us, trigger_id, seq, attempt);
