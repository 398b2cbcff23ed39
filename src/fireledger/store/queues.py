"""The dispatch area's second half: queues, outcomes and tenant quotas (the contracts are in
:mod:`fireledger.store.dispatch`; :class:`~fireledger.store.dispatch.SqlDispatch` extends this)."""

from __future__ import annotations

from collections.abc import Sequence

from fireledger.domain.dispatch_records import OUTCOMES, QueueMessage
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Fire, Target
from fireledger.domain.trust_records import AuditNote

from . import rows as rec
from .core import AppendAudit, Area
from .engine import Engine, StoreError
from .queries import FIRE_NCOLS


class OutcomeRejected(StoreError):
    """A signed outcome callback that cannot be recorded: ``reason`` is ``replayed`` (this
    ``webhook-id`` was already accepted) or ``conflict`` (another outcome is already recorded)."""

    def __init__(self, reason: str, recorded: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.recorded = recorded


class DispatchQueues(Area):
    """Queues (at-least-once, visibility timeout, ack by fire key), work outcomes and tenant quotas."""

    def __init__(self, engine: Engine, append_audit: AppendAudit) -> None:
        super().__init__(engine)
        self._audit = append_audit

    def queue_pull(self, tenant_id: str, target_id: str, now_us: int, limit: int,
                   visibility_us: int) -> list[QueueMessage]:
        """Hand out up to ``limit`` visible messages of a queue, oldest scheduled instant first, and
        hide them until ``now + visibility_us`` (a message not acked by then is handed out again:
        at-least-once). Concurrent consumers never receive the same message within its visibility
        (``SKIP LOCKED`` on PostgreSQL)."""
        q = self.q
        until = now_us + visibility_us
        out: list[QueueMessage] = []
        with self.engine.write() as c:
            rows = c.execute(q["dp_queue_pick"], {"tenant_id": tenant_id, "target_id": target_id,
                                                  "now_us": now_us, "limit": limit}).fetchall()
            params = []
            for r in rows:
                fire = rec.fire(r[5:-1])
                params.append({**rec.key_params(fire), "visible_us": until})
                out.append(QueueMessage(fire, bytes(r[-1]), int(r[4]) + 1, until))
            if params:
                c.cursor().executemany(q["dp_queue_hide"], params)
        return out

    def queue_ack(self, tenant_id: str, target_id: str, keys: Sequence[FireKey]) -> list[bool]:
        """Remove acked messages (by fire key); False for a key not on this queue (already acked,
        or never delivered to it)."""
        out = []
        with self.engine.write() as c:
            for k in keys:
                if k.tenant_id != tenant_id:
                    out.append(False)
                    continue
                n = c.execute(self.q["dp_queue_ack"], {**rec.key_params(k), "target_id": target_id}).rowcount
                out.append(n == 1)
        return out

    def queue_stats(self, tenant_id: str, target_id: str, now_us: int) -> tuple[int, int, int | None]:
        """(messages, of which visible now, oldest scheduled instant or None)."""
        with self.engine.read() as c:
            row = c.execute(self.q["dp_queue_stats"], {"tenant_id": tenant_id, "target_id": target_id,
                                                       "now_us": now_us}).fetchone()
        return int(row[0]), int(row[1]), None if row[2] is None else int(row[2])

    def outcome_context(self, key: FireKey) -> tuple[Fire, Target] | None:
        """The fire and the target its version dispatches to (whose secret signs callbacks)."""
        with self.engine.read() as c:
            row = c.execute(self.q["dp_outcome_context"], rec.key_params(key)).fetchone()
        if not row:
            return None
        return rec.fire(row[:FIRE_NCOLS]), rec.target(row[FIRE_NCOLS:])

    def record_outcome(self, key: FireKey, outcome: str, now_us: int, *, target_id: str, msg_id: str,
                       replay_window_us: int) -> bool:
        """Record a work outcome reported by a verified callback, in one transaction.

        Returns True when recorded now, False when the same outcome was already recorded (an
        idempotent repeat). Raises :class:`OutcomeRejected` — and records nothing — when this
        ``msg_id`` was already accepted for this target within the replay window (``replayed``), or
        a different outcome is already recorded (``conflict``). Receipts older than twice the window
        are purged as a side effect.
        """
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}")
        q = self.q
        with self.engine.write() as c:   # raising inside rolls the receipt back too
            c.execute(q["dp_receipts_purge"], {"before_us": now_us - 2 * replay_window_us})
            fresh = c.execute(q["dp_receipt"], {"target_id": target_id, "msg_id": msg_id,
                                                "now_us": now_us}).rowcount
            if fresh != 1:
                raise OutcomeRejected("replayed")
            n = c.execute(q["dp_outcome_insert"], {**rec.key_params(key), "outcome": outcome,
                                                   "now_us": now_us}).rowcount
            if n == 1:
                return True
            row = c.execute(q["dp_outcome_get"], rec.key_params(key)).fetchone()
            if row is not None and row[0] != outcome:
                raise OutcomeRejected("conflict", str(row[0]))
            return False

    def get_outcome(self, key: FireKey) -> tuple[str, int] | None:
        """(outcome, reported_us), or None: no outcome reported (``unknown``)."""
        with self.engine.read() as c:
            row = c.execute(self.q["dp_outcome_get"], rec.key_params(key)).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def tenant_quota(self, tenant_id: str) -> tuple[float, int, float] | None:
        """(fires/s, attempts in flight, catch-up fraction) of a live tenant."""
        with self.engine.read() as c:
            row = c.execute(self.q["dp_quota_get"], {"id": tenant_id}).fetchone()
        return None if row is None else (float(row[0]), int(row[1]), float(row[2]))

    def set_tenant_quota(self, tenant_id: str, *, fires_per_s: float | None = None, inflight: int | None = None,
                         catchup_fraction: float | None = None, actor: str | None = None,
                         now_us: int = 0) -> tuple[float, int, float] | None:
        """Change a tenant's quota (unset parts keep their value); returns the prior quota, or None
        for no such tenant. ``fires_per_s`` > 0, ``inflight`` ≥ 1, ``0 < catchup_fraction ≤ 1``
        (``ValueError`` naming the field otherwise). Takes effect at the next claim. With ``actor``,
        the change is audited (action ``tenant.quota``, prior and new values) in the same
        transaction (seed ADR-15: a quota change multiplies work)."""
        if fires_per_s is not None and not (fires_per_s > 0 and fires_per_s < float("inf")):
            raise ValueError("fires_per_s must be a finite number > 0")
        if inflight is not None and (isinstance(inflight, bool) or not isinstance(inflight, int) or inflight < 1):
            raise ValueError("inflight must be an integer >= 1")
        if catchup_fraction is not None and not 0 < catchup_fraction <= 1:
            raise ValueError("catchup_fraction must be > 0 and <= 1")
        with self.engine.write() as c:
            row = c.execute(self.q["dp_quota_get"], {"id": tenant_id}).fetchone()
            if row is None:
                return None
            prior = (float(row[0]), int(row[1]), float(row[2]))
            new = (prior[0] if fires_per_s is None else float(fires_per_s),
                   prior[1] if inflight is None else inflight,
                   prior[2] if catchup_fraction is None else float(catchup_fraction))
            c.execute(self.q["dp_quota_set"], {"id": tenant_id, "fires_per_s": new[0], "inflight": new[1],
                                               "catchup_fraction": new[2]})
            if actor is not None:
                names = ("fires_per_s", "inflight", "catchup_fraction")
                self._audit(c, AuditNote(tenant_id, actor, "tenant.quota", now_us,
                                         dict(zip(names, prior, strict=True)), dict(zip(names, new, strict=True))))
        return prior


__all__ = ["DispatchQueues", "OutcomeRejected"]
