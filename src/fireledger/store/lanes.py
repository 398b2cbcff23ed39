"""Lane due ages, declared drains and delivery counts (decisions 0165–0167; the contracts are stated
in the history and dispatch protocols). Two mixins: :class:`HistoryLanes` (read only; extended by
:class:`~fireledger.store.history.SqlHistory`) and :class:`DispatchDrains` (the audited drain acts;
extended by :class:`~fireledger.store.dispatch.SqlDispatch`).

* The due age of a lane is one index-ordered ``LIMIT 1`` over ``fires_never_attempted`` (a partial
  index of pending fires never attempted, by lane and dispatch time: migration 0017), so a scrape
  costs three index probes whatever the backlog.
* Delivery counts are read per tenant over a window of scheduled instants (the range of
  the fires' primary key, then each fire's attempts by primary key; both lead with tenant and instant).
"""

from __future__ import annotations

from typing import Any

from fireledger.domain.keys import new_id
from fireledger.domain.lane_records import DeliveryCounts, Drain
from fireledger.domain.trust_records import AuditNote

from . import queries
from .core import AppendAudit, Area

_WINDOW = "f.tenant_id = :tenant_id AND f.scheduled_us >= :lo AND f.scheduled_us < :hi"
_JOIN = ("JOIN attempts a ON a.tenant_id = f.tenant_id AND a.trigger_id = f.trigger_id "
         "AND a.scheduled_us = f.scheduled_us AND a.seq = f.seq")
_SAME_FIRE = ("b.tenant_id = a.tenant_id AND b.trigger_id = a.trigger_id AND b.scheduled_us = a.scheduled_us "
              "AND b.seq = a.seq")
_DRAIN_COLS = "id, started_us, expires_us, reason, actor, ended_us, ended_by"

LANE_QUERIES: dict[str, str] = {
    "ln_lane_oldest": (
        "SELECT next_attempt_us FROM fires WHERE lane = :lane AND state = 'pending' AND dispatched_us IS NULL "
        "ORDER BY next_attempt_us LIMIT 1"
    ),
    "ln_undecided_oldest": "SELECT next_us FROM due ORDER BY next_us LIMIT 1",
    "ln_delivered_fires": f"SELECT COUNT(*) FROM fires f WHERE {_WINDOW} AND f.state = 'delivered'",
    "ln_duplicate_attempts": (
        f"SELECT COUNT(*) FROM fires f {_JOIN} WHERE {_WINDOW} AND a.result = 'delivered' "
        f"AND EXISTS (SELECT 1 FROM attempts b WHERE {_SAME_FIRE} AND b.attempt < a.attempt "
        "AND b.result = 'delivered')"
    ),
    "ln_possible_duplicates": (
        f"SELECT COUNT(*) FROM fires f {_JOIN} WHERE {_WINDOW} AND f.state = 'delivered' "
        "AND (a.result IS NULL OR a.result = 'unknown') "
        f"AND EXISTS (SELECT 1 FROM attempts b WHERE {_SAME_FIRE} AND b.attempt > a.attempt)"
    ),
    "ln_drain_in_force": (
        f"SELECT {_DRAIN_COLS} FROM drains WHERE ended_us IS NULL AND started_us <= :now AND expires_us > :now "
        "ORDER BY started_us DESC, id DESC LIMIT 1"
    ),
    "ln_drain_latest": f"SELECT {_DRAIN_COLS} FROM drains ORDER BY started_us DESC, id DESC LIMIT 1",
    "ln_drain_end": (
        "UPDATE drains SET ended_us = :now, ended_by = :actor WHERE ended_us IS NULL AND expires_us > :now"
    ),
    "ln_drain_insert": (
        f"INSERT INTO drains ({_DRAIN_COLS}) VALUES (:id, :started_us, :expires_us, :reason, :actor, NULL, NULL)"
    ),
}

queries.register(LANE_QUERIES)


def _drain(row: Any) -> Drain:
    return Drain(str(row[0]), int(row[1]), int(row[2]), str(row[3]), str(row[4]),
                 None if row[5] is None else int(row[5]), None if row[6] is None else str(row[6]))


class HistoryLanes(Area):
    """Read-only: the due age of each lane and of the due index, and delivery counts."""

    def lane_due_since(self, lanes: tuple[str, ...]) -> dict[str, int]:
        """Per lane of ``lanes``, the dispatch time (µs) of its oldest fire never attempted (pending,
        no attempt yet); lanes with none are absent. One index-ordered ``LIMIT 1`` per lane."""
        out: dict[str, int] = {}
        with self.engine.read() as c:
            for lane in lanes:
                row = c.execute(self.q["ln_lane_oldest"], {"lane": lane}).fetchone()
                if row is not None and row[0] is not None:
                    out[lane] = int(row[0])
        return out

    def undecided_since(self) -> int | None:
        """The instant (µs) of the earliest due-index row (not yet decided), or None for an empty index.
        It is due only when it is not after the caller's now."""
        with self.engine.read() as c:
            row = c.execute(self.q["ln_undecided_oldest"]).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def delivery_counts(self, tenant_id: str, lo_us: int, hi_us: int) -> DeliveryCounts:
        """The tenant's fires with ``lo_us <= scheduled_us < hi_us``: how many were delivered, how
        many ``delivered`` attempts followed an earlier ``delivered`` attempt of the same fire
        (proven duplicates), and how many attempts of a delivered fire, other than its last, ended
        without the ledger learning the receiver's answer (``unknown`` or no result: possible
        duplicates). One read transaction."""
        p = {"tenant_id": tenant_id, "lo": lo_us, "hi": hi_us}
        with self.engine.read() as c:
            fires = int(c.execute(self.q["ln_delivered_fires"], p).fetchone()[0])
            dup = int(c.execute(self.q["ln_duplicate_attempts"], p).fetchone()[0])
            possible = int(c.execute(self.q["ln_possible_duplicates"], p).fetchone()[0])
        return DeliveryCounts(fires, dup, possible)


class DispatchDrains(Area):
    """The declared drain: start, stop, read. Acts are audited in their own transaction."""

    _audit: AppendAudit

    def drain_start(self, until_us: int, reason: str, actor: str, now_us: int) -> Drain:
        """Declare a drain in force from ``now_us`` until ``until_us`` (> ``now_us``). A drain
        already in force ends at ``now_us`` (it is superseded: re-declaring extends or shortens).
        Audited (action ``drain.start``; prior: the superseded drain or null) in the same
        transaction. ``ValueError`` for an empty reason or an expiry not after now."""
        if until_us <= now_us:
            raise ValueError("until_us must be after now_us")
        if not reason.strip():
            raise ValueError("reason must not be empty")
        drain = Drain(new_id("dr"), now_us, until_us, reason, actor)
        with self.engine.write() as c:
            prior_row = c.execute(self.q["ln_drain_in_force"], {"now": now_us}).fetchone()
            c.execute(self.q["ln_drain_end"], {"now": now_us, "actor": actor})
            c.execute(self.q["ln_drain_insert"], {"id": drain.id, "started_us": now_us, "expires_us": until_us,
                                                  "reason": reason, "actor": actor})
            prior = None if prior_row is None else _drain(prior_row).as_json(now_us)
            self._audit(c, AuditNote(None, actor, "drain.start", now_us, prior, drain.as_json(now_us)))
        return drain

    def drain_stop(self, actor: str, now_us: int) -> Drain | None:
        """End the drain in force at ``now_us`` (audited: action ``drain.stop``, in the same
        transaction) and return it as ended; None (nothing written) when none is in force."""
        with self.engine.write() as c:
            row = c.execute(self.q["ln_drain_in_force"], {"now": now_us}).fetchone()
            if row is None:
                return None
            c.execute(self.q["ln_drain_end"], {"now": now_us, "actor": actor})
            before = _drain(row)
            after = Drain(before.id, before.started_us, before.expires_us, before.reason, before.actor, now_us, actor)
            self._audit(c, AuditNote(None, actor, "drain.stop", now_us, before.as_json(now_us), after.as_json(now_us)))
        return after

    def drain_in_force(self, now_us: int) -> Drain | None:
        """The drain in force at ``now_us`` (declared, not stopped, not expired), or None."""
        with self.engine.read() as c:
            row = c.execute(self.q["ln_drain_in_force"], {"now": now_us}).fetchone()
        return None if row is None else _drain(row)

    def drain_latest(self) -> Drain | None:
        """The most recently declared drain, whether or not it is still in force (None: never)."""
        with self.engine.read() as c:
            row = c.execute(self.q["ln_drain_latest"]).fetchone()
        return None if row is None else _drain(row)


__all__ = ["LANE_QUERIES", "DispatchDrains", "HistoryLanes"]
