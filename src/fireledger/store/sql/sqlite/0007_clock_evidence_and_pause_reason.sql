-- Issue 13 (decisions 0086-0087). Every fire records the clock bound in force when it was decided:
-- eps_us (half the width of the clock interval the decider read) and eps_source (who vouched for it:
-- kernel, declared, or either cross-checked against PostgreSQL, e.g. kernel+postgres). NULL on fires
-- decided before this migration. A trigger the timing plane had to pause (its stored schedule no
-- longer compiles, or cannot be planned) says why in pause_reason; NULL for a pause by a principal.
ALTER TABLE fires ADD COLUMN eps_us BIGINT;
ALTER TABLE fires ADD COLUMN eps_source TEXT;
ALTER TABLE triggers ADD COLUMN pause_reason TEXT;
