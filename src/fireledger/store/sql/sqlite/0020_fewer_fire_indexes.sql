-- Issue 15, second round (decision 0194): one secondary index fewer on fires, written on every fire
-- inserted, claimed and settled. fires_dispatchable (lane, next_attempt_us over pending/dispatching,
-- migration 0001) served the whole-lane claim only; the planes claim through the bounded walk over
-- fires_lane_tenant_due (0012), the on-time wait per partition reads fires_never_attempted (0017),
-- and claim_dispatch (a tool and test path) reads the lane's live rows from fires_lane_tenant_due.
DROP INDEX IF EXISTS fires_dispatchable;
