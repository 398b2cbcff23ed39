"""Backfill's store operations (a :class:`~fireledger.store.SqlStore` mixin).

* :meth:`BackfillMixin.backfill_window` — what the ledger already holds for one trigger over a
  window: the instants that have a backfill fire (the backfill sequence) and the instants that have
  a delivered fire of any sequence. One range of the primary key (tenant, trigger, instant, seq).
* :meth:`BackfillMixin.commit_backfill` — insert the backfill fires (``ON CONFLICT DO NOTHING``: a
  key already present is a normal outcome, reported as such) **and** the audit row of the act in ONE
  transaction, so no backfill fire exists without its audit record and a refused or failed commit
  leaves neither. ``progress`` is called between chunks (the operator command draws a progress bar);
  the transaction stays one.

The store never reads a clock: the caller passes the instant the fires are decided at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fireledger.domain.model import NewFire

from . import queries

BACKFILL_QUERIES: dict[str, str] = {
    "bf_window": (
        "SELECT scheduled_us, seq, state FROM fires WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us >= :lo AND scheduled_us < :hi AND (seq = :seq OR state = 'delivered')"
    ),
}

queries.register(BACKFILL_QUERIES)

#: Fires inserted between two progress callbacks.
PROGRESS_CHUNK = 200


class BackfillMixin:
    """Backfill operations (see the module docstring)."""

    engine: Any
    q: dict[str, str]
    _append_audit: Callable[..., Any]   # the audit chain's in-transaction append (TrustMixin)

    def backfill_window(self, tenant_id: str, trigger_id: str, lo_us: int, hi_us: int,
                        seq: int) -> tuple[set[int], set[int]]:
        """For ``lo_us <= scheduled_us < hi_us``: (instants holding a fire with sequence ``seq``,
        instants holding a delivered fire of any sequence)."""
        present: set[int] = set()
        delivered: set[int] = set()
        with self.engine.read() as c:
            rows = c.execute(self.q["bf_window"], {"tenant_id": tenant_id, "trigger_id": trigger_id,
                                                   "lo": lo_us, "hi": hi_us, "seq": seq}).fetchall()
        for scheduled_us, s, state in rows:
            if int(s) == seq:
                present.add(int(scheduled_us))
            if state == "delivered":
                delivered.add(int(scheduled_us))
        return present, delivered

    def commit_backfill(self, fires: Sequence[NewFire], *, tenant_id: str, actor: str, at_us: int,
                        prior: Any, audit_new: dict[str, Any],
                        progress: Callable[[int, int], None] | None = None) -> list[NewFire]:
        """Insert ``fires`` and append the ``trigger.backfill`` audit row in one transaction; returns
        the fires inserted (a key that exists already inserts nothing). The audit row's ``new`` value
        is ``audit_new`` plus ``created`` and ``already_present`` as counted inside the transaction."""
        inserted: list[NewFire] = []
        total = len(fires)
        with self.engine.write() as c:
            for i, f in enumerate(fires):
                n = c.execute(self.q["insert_fire"], {
                    "tenant_id": f.tenant_id, "trigger_id": f.trigger_id, "scheduled_us": f.scheduled_us,
                    "seq": f.seq, "version": f.version, "kind": f.kind.value, "lane": f.lane.value,
                    "state": f.state.value, "cause": f.cause, "decided_us": f.decided_us,
                    "decided_by": f.decided_by, "finished_us": None, "tzdata_version": f.tzdata_version,
                    "next_attempt_us": f.not_before_us if f.not_before_us is not None else f.decided_us,
                    "eps_us": f.eps_us, "eps_source": f.eps_source,
                }).rowcount
                if n > 1:
                    from .sql_store import InvariantViolation

                    raise InvariantViolation(f"insert_fire matched {n} rows")
                if n == 1:
                    inserted.append(f)
                if progress is not None and ((i + 1) % PROGRESS_CHUNK == 0 or i + 1 == total):
                    progress(i + 1, total)
            new = {**audit_new, "created": len(inserted),
                   "already_present": int(audit_new.get("already_present", 0)) + total - len(inserted)}
            self._append_audit(c, tenant_id, actor, "trigger.backfill", at_us, prior, new)
        return inserted


__all__ = ["BACKFILL_QUERIES", "PROGRESS_CHUNK", "BackfillMixin"]
