-- Issue 17 item 4 (decision 0175): run-now is the `runner` grant's act, no longer the `author`'s.
-- Principals that existed before this migration keep what they could do: each one holding `author`
-- is granted `runner` too (roles are a comma-separated list, in any order).
-- Principals created afterwards get `runner` only when it is asked for.
UPDATE principals SET roles = roles || ',runner'
 WHERE (',' || roles || ',') LIKE '%,author,%' AND (',' || roles || ',') NOT LIKE '%,runner,%';
