"""Overlap policy store operations (SQL text; the methods are the timing area's, decision 0060).

* :meth:`SqlTiming.overlap_facts` — for a batch of triggers, in ONE statement: each trigger's
  previous fire (its most recent fire by key order, ``(scheduled_us, seq)``, that is not
  ``skipped``, ``expired`` or ``held``, nor a dead letter's delivery record) with its state, first
  dispatch and whether a work outcome was reported, and the fire it holds (``held``, at most one).
  Walks the primary key backwards from the newest fire (skipping the few skipped/expired records
  an overlap leaves behind) and the ``fires_held`` partial index (migration 0006).
* :meth:`SqlTiming.held_fires` — every held fire (the timing loop re-evaluates them each cycle)
  with its trigger's partition and current version.
* :meth:`SqlTiming.release_held` — compare-and-set ``held`` → ``pending`` (released) in one
  transaction; zero rows (already released or superseded elsewhere) is a normal outcome.
* ``_apply_fire_updates`` — the same compare-and-set inside ``apply_decisions``' transaction (a
  held fire superseded by a newer instant, committed with the decision that holds the newer one).

Store methods take ``now_us`` from the caller and never read a clock.
"""

from __future__ import annotations

from typing import Any

from fireledger.domain.model import FireState, FireUpdate

from . import queries

_NOT_PREVIOUS = "('skipped', 'expired', 'held')"
#: A dead letter's delivery record (decision 0178) is not the trigger's work: never a previous fire.
_NOT_DELIVERY = "kind <> 'dead-letter'"
_COLS = "f.tenant_id, f.trigger_id, f.scheduled_us, f.seq, f.version, f.state, f.dispatched_us"
_HAS_OUTCOME = "CASE WHEN o.outcome IS NULL THEN 0 ELSE 1 END"
_OUTCOME_JOIN = ("LEFT JOIN work_outcomes o ON o.tenant_id = f.tenant_id AND o.trigger_id = f.trigger_id "
                 "AND o.scheduled_us = f.scheduled_us AND o.seq = f.seq")

# SQLite has no LATERAL: take each trigger's newest eligible instant by a correlated scalar subquery
# (a backward walk of the primary key), then the fires at that instant (usually one; the caller
# keeps the highest seq). PostgreSQL does the same walk with LATERAL ... LIMIT 1.
_SQLITE_FACTS = (
    "WITH t AS (SELECT json_extract(value, '$[0]') AS tenant_id, json_extract(value, '$[1]') AS trigger_id "
    "  FROM json_each(:ids)), "
    "p AS (SELECT t.tenant_id, t.trigger_id, (SELECT g.scheduled_us FROM fires g WHERE g.tenant_id = t.tenant_id "
    f"  AND g.trigger_id = t.trigger_id AND g.state NOT IN {_NOT_PREVIOUS} AND g.{_NOT_DELIVERY} "
    "  ORDER BY g.scheduled_us DESC, g.seq DESC LIMIT 1) AS s_us FROM t) "
    f"SELECT 'p', {_COLS}, {_HAS_OUTCOME} FROM p JOIN fires f ON f.tenant_id = p.tenant_id "
    "AND f.trigger_id = p.trigger_id AND f.scheduled_us = p.s_us "
    f"{_OUTCOME_JOIN} WHERE f.state NOT IN {_NOT_PREVIOUS} AND f.{_NOT_DELIVERY} "
    "UNION ALL "   # without statistics SQLite would walk the trigger's whole history by primary key
    f"SELECT 'h', {_COLS}, 0 FROM t JOIN fires f INDEXED BY fires_held ON f.tenant_id = t.tenant_id "
    "AND f.trigger_id = t.trigger_id WHERE f.state = 'held'"
)
_PG_FACTS = (
    "WITH t AS (SELECT j->>0 AS tenant_id, j->>1 AS trigger_id FROM jsonb_array_elements(CAST(:ids AS jsonb)) j) "
    f"SELECT 'p', {_COLS}, {_HAS_OUTCOME} FROM t CROSS JOIN LATERAL ("
    "  SELECT g.tenant_id, g.trigger_id, g.scheduled_us, g.seq, g.version, g.state, g.dispatched_us FROM fires g "
    f"  WHERE g.tenant_id = t.tenant_id AND g.trigger_id = t.trigger_id AND g.state NOT IN {_NOT_PREVIOUS} "
    f"  AND g.{_NOT_DELIVERY} "
    "  ORDER BY g.scheduled_us DESC, g.seq DESC LIMIT 1) f "
    f"{_OUTCOME_JOIN} "
    "UNION ALL "
    f"SELECT 'h', {_COLS}, 0 FROM t JOIN fires f ON f.tenant_id = t.tenant_id AND f.trigger_id = t.trigger_id "
    "WHERE f.state = 'held'"
)

OVERLAP_QUERIES: dict[str, str] = {
    "ov_facts": _SQLITE_FACTS,
    "ov_held_all": (
        "SELECT f.tenant_id, f.trigger_id, f.scheduled_us, f.seq, f.version, tr.partition, tr.current_version, "
        "f.kind, f.lane, f.tzdata_version "
        "FROM fires f JOIN triggers tr ON tr.id = f.trigger_id WHERE f.state = 'held' "
        "AND (f.scheduled_us, f.trigger_id, f.seq) > (:c_us, :c_tr, :c_seq) "
        "ORDER BY f.scheduled_us, f.trigger_id, f.seq LIMIT :limit"
    ),
    "ov_update": (
        "UPDATE fires SET state = :new_state, cause = :cause, finished_us = :finished_us, "
        "next_attempt_us = :next_attempt_us, lease_owner = NULL "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us "
        "AND seq = :seq AND state = :expected_state"
    ),
}

queries.register(OVERLAP_QUERIES, {"postgres": {"ov_facts": _PG_FACTS}})


def update_params(u: FireUpdate) -> dict[str, Any]:
    live = u.new_state in (FireState.PENDING, FireState.HELD)
    return {"tenant_id": u.tenant_id, "trigger_id": u.trigger_id, "scheduled_us": u.scheduled_us, "seq": u.seq,
            "expected_state": u.expected_state.value, "new_state": u.new_state.value, "cause": u.cause,
            "finished_us": None if live else u.at_us,
            "next_attempt_us": u.at_us if u.new_state == FireState.PENDING else None}


__all__ = ["OVERLAP_QUERIES", "update_params"]
