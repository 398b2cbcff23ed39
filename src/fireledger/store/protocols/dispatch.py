"""The dispatch area's contract: claims (with the shaping state they read and write), settlement,
queues, work outcomes and tenant quotas.

Implemented by :class:`fireledger.store.dispatch.SqlDispatch` over SQLite and PostgreSQL and reached
as ``store.dispatch``. Every method that writes runs in its own transaction unless it says otherwise,
takes its instants from the caller and never reads a clock; a compare-and-set that matches no row
returns False/None (a normal outcome: moved or decided elsewhere), one that matches more than one
raises :class:`~fireledger.store.core.InvariantViolation` and rolls back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from fireledger.domain.dispatch_records import ClaimResult, QueueMessage, Settlement, Shaper
from fireledger.domain.keys import FireKey
from fireledger.domain.lane_records import Drain
from fireledger.domain.model import DispatchJob, Fire, Target
from fireledger.domain.trust_records import AuditNote


class DispatchStore(Protocol):
    """The dispatch area (module docstring)."""

    def claim_dispatch(self, lane: str, now_us: int, limit: int, owner: str,
                       lease_us: int, lease_margin_us: int = 0) -> list[DispatchJob]:
        """Lease up to ``limit`` dispatchable fires of ``lane`` (pending, or dispatching with an
        expired lease) to ``owner`` until ``now_us + lease_us``; records each attempt as started.
        With ``lease_margin_us``, each lease is then fitted to its own attempt deadline
        (``timeout + margin``), so a killed runner's fires return to the lane soon after.

        On PostgreSQL concurrent dispatchers skip each other's rows (``SKIP LOCKED``). Reads and
        orders the lane's live fires (index ``fires_lane_tenant_due``): a tool and test path, not
        bounded by the backlog; the planes claim with :meth:`claim_shaped` (decisions 0130, 0194).
        """
        ...

    def claim_shaped(self, now_us: int, owner: str, fetch: Mapping[str, int], shaper: Shaper,
                     lease_margin_us: int) -> ClaimResult:
        """Lease the fires ``shaper`` admits, in one transaction (see the module docstring).

        ``fetch`` maps a lane to how many candidates to offer from it (0 or absent: none). Each
        admitted fire goes ``dispatching``, leased to ``owner`` until its attempt's deadline
        (``now + timeout``) plus ``lease_margin_us``, with its attempt counter raised and an attempt
        row started; a runner that dies leaves the lease to expire and the fire to be claimed again
        as a further attempt under the same key.

        The candidates are a bounded batch read inside the transaction (:mod:`fireledger.store.claim_sql`, decision
        0130): what a claim reads does not grow with the backlog, on either engine.
        """
        ...

    def dead_letters(self, tenant_id: str, *, trigger_id: str | None = None, from_us: int | None = None,
                     to_us: int | None = None, cause: str | None = None,
                     after: tuple[int, str, int] | None = None, limit: int = 100) -> list[Fire]:
        """The tenant's dead letters — fires that ended ``failed`` or ``unknown`` — ordered by
        (scheduled instant, trigger id, sequence), strictly after ``after`` (that triple), at most
        ``limit``; only ``trigger_id``'s when given, scheduled in ``[from_us, to_us)``, and whose
        cause contains ``cause`` (case-sensitive, literally). Read only; attempts not attached."""
        ...

    def drain_in_force(self, now_us: int) -> Drain | None:
        """The drain in force at ``now_us`` (declared, not stopped, not expired), or None
        (decision 0166)."""
        ...

    def drain_latest(self) -> Drain | None:
        """The most recently declared drain, whether or not it is still in force (None: never)."""
        ...

    def drain_start(self, until_us: int, reason: str, actor: str, now_us: int) -> Drain:
        """Declare a drain in force from ``now_us`` until ``until_us`` (> ``now_us``): it
        suppresses the page on the due age (decision 0166). A drain already in force ends at
        ``now_us`` (superseded: re-declaring extends or shortens it). Audited (action
        ``drain.start``, no tenant; prior: the superseded drain or null) in the same transaction.
        ``ValueError`` for an empty reason or an expiry not after now."""
        ...

    def drain_stop(self, actor: str, now_us: int) -> Drain | None:
        """End the drain in force at ``now_us`` (audited: action ``drain.stop``, in the same
        transaction) and return it as ended; None, with nothing written, when none is in force."""
        ...

    def get_outcome(self, key: FireKey) -> tuple[str, int] | None:
        """(outcome, reported_us), or None: no outcome reported (``unknown``)."""
        ...

    def outcome_context(self, key: FireKey) -> tuple[Fire, Target] | None:
        """The fire and the target its version dispatches to (whose secret signs callbacks)."""
        ...

    def queue_ack(self, tenant_id: str, target_id: str, keys: Sequence[FireKey]) -> list[bool]:
        """Remove acked messages (by fire key); False for a key not on this queue (already acked,
        or never delivered to it)."""
        ...

    def queue_pull(self, tenant_id: str, target_id: str, now_us: int, limit: int,
                   visibility_us: int) -> list[QueueMessage]:
        """Hand out up to ``limit`` visible messages of a queue, oldest scheduled instant first, and
        hide them until ``now + visibility_us`` (a message not acked by then is handed out again:
        at-least-once). Concurrent consumers never receive the same message within its visibility
        (``SKIP LOCKED`` on PostgreSQL)."""
        ...

    def queue_stats(self, tenant_id: str, target_id: str, now_us: int) -> tuple[int, int, int | None]:
        """(messages, of which visible now, oldest scheduled instant or None)."""
        ...

    def record_outcome(self, key: FireKey, outcome: str, now_us: int, *, target_id: str, msg_id: str,
                       replay_window_us: int) -> bool:
        """Record a work outcome reported by a verified callback, in one transaction.

        Returns True when recorded now, False when the same outcome was already recorded (an
        idempotent repeat). Raises :class:`OutcomeRejected` — and records nothing — when this
        ``msg_id`` was already accepted for this target within the replay window (``replayed``), or
        a different outcome is already recorded (``conflict``). Receipts older than twice the window
        are purged as a side effect.
        """
        ...

    def redrive_fires(self, keys: Sequence[FireKey], now_us: int, *, not_before_us: int,
                      audit: AuditNote | None = None) -> list[FireKey]:
        """Redrive each fire of ``keys`` that is still dead (``failed`` or ``unknown``) and scheduled at or
        after ``not_before_us`` (the retention bound), in ONE transaction with ``audit`` (appended when
        at least one fire was redriven): back to ``pending`` due at ``now_us`` under the same key, cause
        cleared, ``attempt_base`` set to its attempts so far (its retry policy counts the attempts after
        them), ``redriven_us = now_us``. Compare-and-set per fire: a key that is not dead, is past
        retention or does not exist is left out. Returns the keys redriven, in the order given."""
        ...

    def set_tenant_quota(self, tenant_id: str, *, fires_per_s: float | None = None, inflight: int | None = None,
                         catchup_fraction: float | None = None, actor: str | None = None,
                         now_us: int = 0) -> tuple[float, int, float] | None:
        """Change a tenant's quota (unset parts keep their value); returns the prior quota, or None
        for no such tenant. ``fires_per_s`` > 0, ``inflight`` ≥ 1, ``0 < catchup_fraction ≤ 1``
        (``ValueError`` naming the field otherwise). Takes effect at the next claim. With ``actor``,
        the change is audited (action ``tenant.quota``, prior and new values) in the same
        transaction (seed ADR-15: a quota change multiplies work)."""
        ...

    def settle_and_claim(self, items: Sequence[Settlement], now_us: int, owner: str, fetch: Mapping[str, int],
                         shaper: Shaper, lease_margin_us: int) -> tuple[list[bool], ClaimResult]:
        """:meth:`settle_dispatch` of ``items`` and then :meth:`claim_shaped`, in ONE transaction,
        each with its own guarantees; returns what each returns (``([], …)`` for no items). The
        results are recorded before the claim reads, so the claim sees the in-flight quota they free
        and a retry they schedule (decision 0233). Nothing of either is durable before the commit:
        when the store refuses either as a whole, it raises with nothing recorded and nothing leased
        (the caller keeps the results to record them again; their leases hold meanwhile)."""
        ...

    def settle_attempts(self, items: Sequence[Settlement], now_us: int) -> list[bool]:
        """Finish each job's attempt row and settle its fire — a terminal state, or back to
        ``pending`` with ``next_attempt_us`` for a retry — in one transaction.

        Compare-and-set on (state, lease owner, attempt number): False for an item whose lease was
        lost (another runner owns the fire now); its attempt row is still finished.
        """
        ...

    def settle_dispatch(self, items: Sequence[Settlement], now_us: int) -> list[bool]:
        """Finish each attempt and settle its fire in one transaction (``Settlement`` items).

        Compare-and-set on (state, lease owner, attempt number): False for an item whose lease was
        lost (another runner owns the fire now); its attempt row is still finished. A fire delivered
        to a ``queue`` target is put on that queue here, in the same transaction, once (the message's
        key is the fire key). A fire that ends ``failed`` or ``unknown`` under a version naming a
        ``dead_letter_target_id`` gets its dead-letter delivery record in the same transaction, once
        (key: the fire's with sequence + 500 000 000; kind ``dead-letter``, ``pending``, ``catch-up``
        lane; decision 0178) — also when the claim settles it for want of attempts. A claimed
        delivery record's job goes to that target, under the default retry policy, with the dead
        fire and its attempts in ``DispatchJob.dead_letter``.

        No item can hold back the others (invariant 15): a ``next_attempt_us`` outside the
        representable range is clamped into it (:mod:`fireledger.domain.instants`); when the batch
        is refused as a whole, each item is recorded on its own (a savepoint each), and an item the
        store still refuses is *set aside*: its attempt is finished and its fire settled ``failed``
        with a cause naming the error class (never a value), and False is returned for it. Only an
        error that is not the item's (the store is down) raises, with nothing recorded.
        """
        ...

    def tenant_quota(self, tenant_id: str) -> tuple[float, int, float] | None:
        """(fires/s, attempts in flight, catch-up fraction) of a live tenant."""
        ...


__all__ = ["DispatchStore"]
