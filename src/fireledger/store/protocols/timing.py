"""The timing area's contract: due reads, the decisions that commit fires and advance due rows, manual
fires, overlap facts and held fires, partitions, leases, node sessions and the shadow rebuilder.

Implemented by :class:`fireledger.store.timing.SqlTiming` over SQLite and PostgreSQL and reached
as ``store.timing``. Every method that writes runs in its own transaction unless it says otherwise,
takes its instants from the caller and never reads a clock; a compare-and-set that matches no row
returns False/None (a normal outcome: moved or decided elsewhere), one that matches more than one
raises :class:`~fireledger.store.core.InvariantViolation` and rolls back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from fireledger.domain.model import Advance, ClaimOutcome, Decision, DueRow, FireUpdate, NewFire, Policies
from fireledger.domain.timing_records import (
    Divergence,
    Grant,
    HeldRow,
    Lease,
    NodeSession,
    OverlapFacts,
    RebuildStats,
    ShadowReport,
    ShadowRow,
    StrayDue,
)
from fireledger.domain.trust_records import AuditNote


class TimingStore(Protocol):
    """The timing area (module docstring)."""

    def apply_decisions(self, decisions: Sequence[Decision]) -> list[ClaimOutcome]:
        """Commit fires and due-row advances in ONE transaction.

        For each decision: insert its fires (a primary-key conflict inserts nothing: decided
        elsewhere), then compare-and-set the due row. When the CAS finds the row moved (another
        decider, or an amendment/pause committed meanwhile) the fires this call inserted for it are
        removed again, so nothing is decided against a definition no longer in force. Every field of
        a fire is stored, its clock bound (``eps_us``/``eps_source``) and DST label (``dst``) included.
        """
        ...

    def count_out_of_range(self, n: int) -> int:
        """Triggers whose stored partition is ≥ n (left behind by a count change not yet applied)."""
        ...

    def count_triggers(self) -> int:
        """Every trigger row, whatever its state."""
        ...

    def delete_orphan_due(self) -> int:
        """Remove due rows whose trigger does not exist; returns how many."""
        ...

    def due_index(self) -> list[DueRow]:
        """The whole due index, by trigger id (operator commands and tests)."""
        ...

    def due_rows(self, until_us: int, limit: int) -> list[DueRow]:
        """Due-index rows with ``next_us <= until_us``, earliest first."""
        ...

    def due_rows_in(self, until_us: int, limit: int, partitions: Sequence[int], n: int) -> list[DueRow]:
        """Due rows with ``next_us <= until_us`` whose ``partition mod n`` is in ``partitions``,
        earliest first."""
        ...

    def earliest_due(self) -> int | None:
        """The earliest ``next_us`` of the whole due index, or None when it is empty."""
        ...

    def earliest_due_in(self, partitions: Sequence[int], n: int) -> int | None:
        """The earliest ``next_us`` among the due rows of ``partitions`` (None when there is none)."""
        ...

    def ensure_partitions(self, n: int | None = None) -> int:
        """Make sure a lease row and a shadow row exist for every partition < n (idempotent)."""
        ...

    def grant_leases(self, node_id: str, grants: Sequence[Grant], now_us: int) -> list[int]:
        """Take each lease by compare-and-set on the ``rev`` its granter read; returns the partitions
        granted (a lease that moved meanwhile is simply not granted)."""
        ...

    def heartbeat(self, node_id: str, role: str, *, now_us: int, started_us: int, eps_us: int,
                  eps_source: str, shedding: bool, lease_expires_us: int) -> list[tuple[int, int]]:
        """Renew the session of ``node_id`` and, in the same transaction, every lease it holds
        (``expires_us`` = ``lease_expires_us``); while ``shedding``, release them all instead.

        Returns the (partition, epoch) pairs the node holds after the commit."""
        ...

    def held_fires(self, after: tuple[int, str, int] | None = None, limit: int = 1000) -> list[HeldRow]:
        """A page of held fires (at most one per trigger) in ``(scheduled_us, trigger_id, seq)``
        order, after the cursor (the last row of the previous page)."""
        ...

    def insert_fires(self, fires: Sequence[NewFire], *, audit: AuditNote | None = None) -> list[NewFire]:
        """Commit fires that advance no due row (manual runs) in one transaction; returns those
        inserted — a fire whose key exists already inserts nothing (decided elsewhere). ``audit`` is
        appended in the same transaction when at least one fire was inserted (none: no audit row)."""
        ...

    def latest_tzdata(self, triggers: Sequence[tuple[str, str]]) -> dict[str, str]:
        """The tzdata version recorded on each ``(tenant_id, trigger_id)``'s latest decided instant
        (its newest scheduled or catch-up fire), keyed by trigger id, in one statement; a trigger
        never decided is absent."""
        ...

    def lease_table(self) -> list[Lease]:
        """Every lease row, by partition."""
        ...

    def out_of_range_partitions(self, n: int) -> list[int]:
        """The distinct stored partition numbers ≥ n."""
        ...

    def overlap_facts(self, triggers: Sequence[tuple[str, str]]) -> dict[str, OverlapFacts]:
        """Previous and held fire of each ``(tenant_id, trigger_id)``, keyed by trigger id, in one
        statement (triggers with neither are absent)."""
        ...

    def partition_count(self) -> int:
        """The keyspace's partition count (``timing_settings``; 256 unless changed)."""
        ...

    def prune_nodes(self, role: str, before_us: int) -> int:
        """Forget sessions of ``role`` silent since before ``before_us``."""
        ...

    def rebuild_partition(self, partition: int, expected: Callable[[ShadowRow], int | None]) -> RebuildStats:
        """Replace the due rows of the triggers of ``partition`` (and any due row stored under it)
        with the rows ``expected`` computes from the registry and the ledger, in one transaction.

        On PostgreSQL the affected due rows are locked before the snapshot is read, so a decision
        committing concurrently is either seen by the snapshot or waits and then compare-and-sets
        against the rebuilt row."""
        ...

    def release_all_leases(self, node_id: str, now_us: int) -> int:
        """Release every lease of ``node_id``; returns how many."""
        ...

    def release_held(self, updates: Sequence[FireUpdate]) -> list[bool]:
        """Apply held-fire updates (compare-and-set on the expected state) in ONE transaction;
        per update, True when it changed its fire (False: released or superseded elsewhere)."""
        ...

    def release_leases(self, node_id: str, partitions: Sequence[int], now_us: int,
                       handoff_to: dict[int, str | None] | None = None) -> list[int]:
        """Release the listed leases ``node_id`` still holds (each offered to ``handoff_to[p]`` first);
        returns the partitions released."""
        ...

    def repartition_batch(self, after_id: str, limit: int, partition_of: Callable[[str], int]) -> tuple[str, int, int]:
        """Rewrite the stored partition of up to ``limit`` triggers with id > ``after_id`` (and of
        their due rows) to ``partition_of(id)``, in one transaction.

        Returns ``(last id seen, triggers seen, triggers moved)``; last id "" when none was left."""
        ...

    def reresolve_due(self, advance: Advance, audit: AuditNote) -> bool:
        """Move one due row to the instant the running zone rules give (``tzdata diff --apply``):
        the compare-and-set of ``advance`` (expected ``(next_us, version)``; ``new_next_us`` None
        removes the row) and ``audit`` appended in ONE transaction. False — and no audit row — when
        the row moved meanwhile (decided, amended, paused)."""
        ...

    def sessions(self, role: str = "timing") -> list[NodeSession]:
        """The session rows of ``role`` (live or not: the caller judges with its own clock)."""
        ...

    def set_partition_count(self, n: int) -> int:
        """Record a new partition count and resize the lease and shadow tables (one transaction);
        returns the previous count. Lease rows ≥ n disappear: their owners drop them at their next
        renewal. Triggers keep their stored partition until :meth:`repartition_batch` rewrites it."""
        ...

    def shadow_claim(self, node_id: str, now_us: int, n: int) -> int | None:
        """Claim the partition whose shadow check is stalest (compare-and-set on its claim instant,
        so two nodes never check the same partition at once); None when another node won it."""
        ...

    def shadow_divergences(self) -> list[Divergence]:
        """Every divergent row of the latest reports, by partition and trigger."""
        ...

    def shadow_reports(self) -> list[ShadowReport]:
        """The latest report of every partition (divergent rows not included; see
        :meth:`shadow_divergences`). A partition never checked has ``reported_us`` 0."""
        ...

    def shadow_snapshot(self, partition: int) -> tuple[list[ShadowRow], list[StrayDue]]:
        """The triggers of ``partition`` with what the registry, the ledger and the live due index say
        about each (one statement: one snapshot), and the due rows of the partition with no trigger."""
        ...

    def shadow_write(self, report: ShadowReport) -> None:
        """Store ``report`` as the partition's latest (its divergent rows replace the previous ones)."""
        ...

    def stop_node(self, node_id: str, now_us: int) -> int:
        """A clean shutdown: release every lease at once and mark the session stopped."""
        ...

    def version_plans(self, pairs: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[str, Policies]]:
        """What planning needs of many trigger versions, in one statement: ``(trigger_id, version)``
        → (the schedule as stored — its JSON text —, the decoded policies); missing ones are absent.
        A stored policy that does not decode raises (the caller reads those versions one by one)."""
        ...


__all__ = ["TimingStore"]
