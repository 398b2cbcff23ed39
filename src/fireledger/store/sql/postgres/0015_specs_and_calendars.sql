-- Issue 18 items 1-2 (decisions 0155, 0156). A fire of a schedule with several specs records which of
-- them produced its instant (specs: their indexes, comma-separated; NULL for a single-spec schedule).
-- Exclusion calendars: per tenant, named; entries is the JSON list as the API takes it (dates, date
-- ranges, cron-shaped exclusions, each in a zone); revision counts replacements (1 at creation).
ALTER TABLE fires ADD COLUMN specs TEXT;
CREATE TABLE IF NOT EXISTS calendars (
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  name TEXT NOT NULL,
  entries TEXT NOT NULL,
  revision BIGINT NOT NULL,
  created_us BIGINT NOT NULL,
  updated_us BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, name)
);
