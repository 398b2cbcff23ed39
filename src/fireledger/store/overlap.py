"""Overlap policy store operations (a :class:`~fireledger.store.SqlStore` mixin; decision 0060).

* :meth:`OverlapMixin.overlap_facts` — for a batch of triggers, in ONE statement: each trigger's
  previous fire (its most recent fire by key order, ``(scheduled_us, seq)``, that is not
  ``skipped``, ``expired`` or ``held``) with its state, first dispatch and whether a work outcome
  was reported, and the fire it holds (``held``, at most one). Walks the primary key backwards from
  the newest fire (skipping the few skipped/expired records an overlap leaves behind) and the
  ``fires_held`` partial index (migration 0006).
* :meth:`OverlapMixin.held_fires` — every held fire (the timing loop re-evaluates them each cycle)
  with its trigger's partition and current version.
* :meth:`OverlapMixin.release_held` — compare-and-set ``held`` → ``pending`` (released) in one
  transaction; zero rows (already released or superseded elsewhere) is a normal outcome.
* ``_apply_fire_updates`` — the same compare-and-set inside ``apply_decisions``' transaction (a
  held fire superseded by a newer instant, committed with the decision that holds the newer one).

Store methods take ``now_us`` from the caller and never read a clock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fireledger.domain.model import FireState, FireUpdate

from . import queries

_NOT_PREVIOUS = "('skipped', 'expired', 'held')"
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
    f"  AND g.trigger_id = t.trigger_id AND g.state NOT IN {_NOT_PREVIOUS} "
    "  ORDER BY g.scheduled_us DESC, g.seq DESC LIMIT 1) AS s_us FROM t) "
    f"SELECT 'p', {_COLS}, {_HAS_OUTCOME} FROM p JOIN fires f ON f.tenant_id = p.tenant_id "
    "AND f.trigger_id = p.trigger_id AND f.scheduled_us = p.s_us "
    f"{_OUTCOME_JOIN} WHERE f.state NOT IN {_NOT_PREVIOUS} "
    "UNION ALL "   # without statistics SQLite would walk the trigger's whole history by primary key
    f"SELECT 'h', {_COLS}, 0 FROM t JOIN fires f INDEXED BY fires_held ON f.tenant_id = t.tenant_id "
    "AND f.trigger_id = t.trigger_id WHERE f.state = 'held'"
)
_PG_FACTS = (
    "WITH t AS (SELECT j->>0 AS tenant_id, j->>1 AS trigger_id FROM jsonb_array_elements(CAST(:ids AS jsonb)) j) "
    f"SELECT 'p', {_COLS}, {_HAS_OUTCOME} FROM t CROSS JOIN LATERAL ("
    "  SELECT g.tenant_id, g.trigger_id, g.scheduled_us, g.seq, g.version, g.state, g.dispatched_us FROM fires g "
    f"  WHERE g.tenant_id = t.tenant_id AND g.trigger_id = t.trigger_id AND g.state NOT IN {_NOT_PREVIOUS} "
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


@dataclass(frozen=True, slots=True)
class FireFacts:
    """One fire as the overlap check sees it."""

    tenant_id: str
    trigger_id: str
    scheduled_us: int
    seq: int
    version: int
    state: str
    dispatched_us: int | None
    has_outcome: bool


@dataclass(frozen=True, slots=True)
class OverlapFacts:
    """A trigger's previous fire (None: none recorded) and the fire it holds (None: none)."""

    previous: FireFacts | None = None
    held: FireFacts | None = None


@dataclass(frozen=True, slots=True)
class HeldRow:
    """A held fire, with its trigger's partition and current definition version."""

    tenant_id: str
    trigger_id: str
    scheduled_us: int
    seq: int
    version: int
    partition: int
    current_version: int
    kind: str
    lane: str
    tzdata_version: str


def _update_params(u: FireUpdate) -> dict[str, Any]:
    live = u.new_state in (FireState.PENDING, FireState.HELD)
    return {"tenant_id": u.tenant_id, "trigger_id": u.trigger_id, "scheduled_us": u.scheduled_us, "seq": u.seq,
            "expected_state": u.expected_state.value, "new_state": u.new_state.value, "cause": u.cause,
            "finished_us": None if live else u.at_us,
            "next_attempt_us": u.at_us if u.new_state == FireState.PENDING else None}


class OverlapMixin:
    """Store methods of the overlap policy (see the module docstring). Uses ``self.engine``/``self.q``."""

    engine: Any
    q: dict[str, str]

    def overlap_facts(self, triggers: Sequence[tuple[str, str]]) -> dict[str, OverlapFacts]:
        """Previous and held fire of each ``(tenant_id, trigger_id)``, keyed by trigger id, in one
        statement (triggers with neither are absent)."""
        if not triggers:
            return {}
        ids = json.dumps(sorted({(t, tr) for t, tr in triggers}))
        prev: dict[str, FireFacts] = {}
        held: dict[str, FireFacts] = {}
        with self.engine.read() as c:
            rows = c.execute(self.q["ov_facts"], {"ids": ids}).fetchall()
        for r in rows:
            f = FireFacts(str(r[1]), str(r[2]), int(r[3]), int(r[4]), int(r[5]), str(r[6]),
                          None if r[7] is None else int(r[7]), bool(r[8]))
            into = prev if r[0] == "p" else held
            old = into.get(f.trigger_id)
            if old is None or (f.scheduled_us, f.seq) > (old.scheduled_us, old.seq):
                into[f.trigger_id] = f
        return {tid: OverlapFacts(prev.get(tid), held.get(tid)) for tid in set(prev) | set(held)}

    def held_fires(self, after: tuple[int, str, int] | None = None, limit: int = 1000) -> list[HeldRow]:
        """A page of held fires (at most one per trigger) in ``(scheduled_us, trigger_id, seq)``
        order, after the cursor (the last row of the previous page)."""
        c_us, c_tr, c_seq = after if after is not None else (-(2**62), "", -1)
        with self.engine.read() as c:
            rows = c.execute(self.q["ov_held_all"], {"limit": limit, "c_us": c_us, "c_tr": c_tr,
                                                     "c_seq": c_seq}).fetchall()
        return [HeldRow(str(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]),
                        str(r[7]), str(r[8]), str(r[9])) for r in rows]

    def release_held(self, updates: Sequence[FireUpdate]) -> list[bool]:
        """Apply held-fire updates (compare-and-set on the expected state) in ONE transaction;
        per update, True when it changed its fire (False: released or superseded elsewhere)."""
        if not updates:
            return []
        with self.engine.write() as c:
            return self._apply_fire_updates(c, updates)

    def _apply_fire_updates(self, c: Any, updates: Sequence[FireUpdate]) -> list[bool]:
        from .sql_store import _one

        return [_one(c.execute(self.q["ov_update"], _update_params(u)).rowcount, "overlap fire update")
                for u in updates]


__all__ = ["FireFacts", "HeldRow", "OverlapFacts", "OverlapMixin"]
