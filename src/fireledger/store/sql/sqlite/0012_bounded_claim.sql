-- The bounded claim (issue 15, decision 0130). A claim no longer ranks a lane's whole backlog: it
-- walks the tenants with live work in a lane (a loose scan: one index probe per tenant) and reads
-- each tenant's oldest due fires from this index, at most a few per tenant, in order.
CREATE INDEX fires_lane_tenant_due ON fires (lane, tenant_id, next_attempt_us)
  WHERE state IN ('pending', 'dispatching');
-- Only the whole-backlog ranking read fires_lane_fair; the new index replaces it (one index fewer
-- to keep up on every fire written).
DROP INDEX fires_lane_fair;
