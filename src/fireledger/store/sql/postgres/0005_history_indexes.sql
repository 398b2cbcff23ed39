-- History by tenant and time range (GET /v1/fires, the console overview, retention): one ordered
-- range per tenant in the order the API pages in (scheduled instant, trigger, sequence). Per-trigger
-- history needs no index of its own: the primary key (tenant, trigger, scheduled, seq) is one.
CREATE INDEX IF NOT EXISTS fires_by_tenant_instant ON fires (tenant_id, scheduled_us, trigger_id, seq);
