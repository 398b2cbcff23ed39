-- Overlap policy (issue 6, decision 0060): a fire held by overlap policy `queue` is state 'held' —
-- committed, never claimed by dispatch (claims take 'pending'/'dispatching') until the timing plane
-- releases it. At most one per trigger, so this partial index stays tiny: the timing loop reads it
-- every cycle (held fires to re-evaluate) and per overlap-checked trigger (the fire to supersede).
-- Rows in any other state are not in the index, so it costs the hot path (allow) nothing.
CREATE INDEX fires_held ON fires (tenant_id, trigger_id, scheduled_us) WHERE state = 'held';
