-- Issue 17 (decision 0148): dead letters and redrive. A redrive makes a further attempt of a fire that
-- ended failed or unknown, under the same key: attempt_base is the number of attempts made before the
-- fire's latest redrive (its retry policy counts the attempts after them), redriven_us when that
-- redrive was made (NULL: never redriven). The dead letters of a tenant are read by instant from a
-- partial index that holds only the fires that ended failed or unknown.
ALTER TABLE fires ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0;
ALTER TABLE fires ADD COLUMN redriven_us INTEGER;
CREATE INDEX IF NOT EXISTS fires_dead_letters ON fires (tenant_id, scheduled_us, trigger_id, seq)
  WHERE state IN ('failed', 'unknown');
