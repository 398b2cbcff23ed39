"""The dispatch area's dead letters and redrive (decision 0148; the contracts are stated in
:class:`~fireledger.store.protocols.DispatchStore`; :class:`~fireledger.store.dispatch.SqlDispatch`
extends this).

A *dead letter* is a fire that ended ``failed`` or ``unknown``. A *redrive* makes a further attempt
of it under the same key — never a new fire: one compare-and-set turns it back to ``pending``, due at
once, remembering how many attempts were made before (``attempt_base``: the retry policy counts the
attempts after them) and when (``redriven_us``), and appends the act's audit row in the same
transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from fireledger.domain.keys import FireKey
from fireledger.domain.model import Fire
from fireledger.domain.trust_records import AuditNote

from . import queries
from . import rows as rec
from .core import expect_one
from .queues import DispatchQueues

#: The states a dead letter ended in.
DEAD_STATES = ("failed", "unknown")


def _dead_letters(contains: str) -> str:
    """The dead-letter page query; ``contains`` is the engine's substring test (``instr`` on SQLite,
    ``strpos`` on PostgreSQL): both are case-sensitive and take the text literally."""
    return (
        f"SELECT {queries.FIRE_COLS_EVIDENCE} FROM fires INDEXED BY fires_dead_letters WHERE tenant_id = :tenant_id "
        "AND state IN ('failed', 'unknown') "
        "AND (CAST(:trigger_id AS TEXT) IS NULL OR trigger_id = :trigger_id) "
        "AND scheduled_us >= :from_us AND scheduled_us < :to_us "
        f"AND (CAST(:cause AS TEXT) IS NULL OR {contains}(cause, CAST(:cause AS TEXT)) > 0) "
        "AND (scheduled_us > :after_us OR (scheduled_us = :after_us AND (trigger_id > :after_trigger "
        "OR (trigger_id = :after_trigger AND seq > :after_seq)))) "
        "ORDER BY scheduled_us, trigger_id, seq LIMIT :limit"
    )


queries.register({
    "dl_page": _dead_letters("instr"),
    # Compare-and-set: still dead, still within retention, its attempts as read.
    "dl_redrive": (
        "UPDATE fires SET state = 'pending', cause = NULL, next_attempt_us = :now_us, finished_us = NULL, "
        "lease_owner = NULL, attempt_base = attempts, redriven_us = :now_us "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us "
        "AND seq = :seq AND state IN ('failed', 'unknown') AND scheduled_us >= :not_before_us"
    ),
}, {"postgres": {"dl_page": _dead_letters("strpos")}})

_FIRST = (-(2 ** 63), "", -1)


class DispatchRedrive(DispatchQueues):
    """Dead letters and redrive (module docstring)."""

    def dead_letters(self, tenant_id: str, *, trigger_id: str | None = None, from_us: int | None = None,
                     to_us: int | None = None, cause: str | None = None,
                     after: tuple[int, str, int] | None = None, limit: int = 100) -> list[Fire]:
        """See :meth:`fireledger.store.protocols.DispatchStore.dead_letters`."""
        a_us, a_trigger, a_seq = after if after is not None else _FIRST
        params = {"tenant_id": tenant_id, "trigger_id": trigger_id,
                  "from_us": -(2 ** 63) if from_us is None else from_us,
                  "to_us": 2 ** 63 - 1 if to_us is None else to_us, "cause": cause or None,
                  "after_us": a_us, "after_trigger": a_trigger, "after_seq": a_seq, "limit": limit}
        with self.engine.read() as c:
            return [rec.fire(r) for r in c.execute(self.q["dl_page"], params).fetchall()]

    def redrive_fires(self, keys: Sequence[FireKey], now_us: int, *, not_before_us: int,
                      audit: AuditNote | None = None) -> list[FireKey]:
        """See :meth:`fireledger.store.protocols.DispatchStore.redrive_fires`."""
        done: list[FireKey] = []
        with self.engine.write() as c:
            for k in keys:
                n = c.execute(self.q["dl_redrive"], {**rec.key_params(k), "now_us": now_us,
                                                     "not_before_us": not_before_us}).rowcount
                if expect_one(n, "redriving a fire"):
                    done.append(k)
            if audit is not None and done:
                self._audit(c, audit)
        return done


__all__ = ["DEAD_STATES", "DispatchRedrive"]
