-- Issue 18 item 6 (decision 0160). Every fire whose instant came from a wall time the zone skipped
-- (spring-forward gap: the instant is the jump) or from the first pass of a repeated one (fall-back
-- fold) says so: dst is 'gap <wall>' or 'fold <wall>' (the wall time asked for, e.g.
-- 'gap 2027-03-28T01:30'), decided by the compiler with the instant and written in the same batched
-- statement. NULL: an ordinary wall time, an interval or one-shot, or a fire decided before this.
ALTER TABLE fires ADD COLUMN dst TEXT;
