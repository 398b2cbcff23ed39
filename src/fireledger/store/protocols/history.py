"""The history area's contract: history and evidence reads, reports, console pages, operator views and retention.

Implemented by :class:`fireledger.store.history.SqlHistory` over SQLite and PostgreSQL and reached
as ``store.history``. Every method that writes runs in its own transaction unless it says otherwise,
takes its instants from the caller and never reads a clock; a compare-and-set that matches no row
returns False/None (a normal outcome: moved or decided elsewhere), one that matches more than one
raises :class:`~fireledger.store.core.InvariantViolation` and rolls back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from fireledger.domain.history_records import ExpiringFire, TenantCursor
from fireledger.domain.keys import FireKey
from fireledger.domain.lane_records import DeliveryCounts
from fireledger.domain.model import Fire, Trigger, TriggerVersion
from fireledger.domain.timing_records import LeaseRow, NodeRow
from fireledger.store.reports import SmearRow


class HistoryStore(Protocol):
    """The history area (module docstring)."""

    def console_recent_states(self, tenant_id: str, limit: int, n: int, before_us: int) -> dict[str, list[str]]:
        """For the tenant's first ``limit`` live triggers by id: the states of each one's last ``n``
        fires scheduled before ``before_us``, newest first, in one statement (triggers without
        fires are absent)."""
        ...

    def console_triggers(self, tenant_id: str, limit: int) -> list[tuple[Trigger, TriggerVersion | None]]:
        """The tenant's live triggers by id (at most ``limit``), each with its current version
        (its payload left out: ``b""``), in one statement."""
        ...

    def count_expiring(self, tenant_id: str, before_us: int) -> tuple[int, int]:
        """(terminal fires scheduled before ``before_us``, live fires scheduled before it)."""
        ...

    def count_fires(self) -> int:
        """How many fire records the ledger holds (every tenant)."""
        ...

    def delivery_counts(self, tenant_id: str, lo_us: int, hi_us: int) -> DeliveryCounts:
        """The tenant's fires with ``lo_us <= scheduled_us < hi_us`` (decision 0167): how many were
        delivered; how many ``delivered`` attempts followed an earlier ``delivered`` attempt of the
        same fire (proven duplicates: the receiver acknowledged the key twice); how many attempts of
        a delivered fire, other than its last, ended without the ledger learning the receiver's
        answer (result ``unknown`` or none: possible duplicates). One read transaction; cost
        bounded by the window (the fires' and attempts' keys lead with tenant and instant)."""
        ...

    def due_waiting_by_partition(self, now_us: int) -> dict[int, int]:
        """Per partition, the oldest instant still waiting at ``now_us`` (µs): a due-index row not yet
        decided, or an on-time fire not yet attempted whose dispatch time has passed (catch-up and
        backfill fires never count: decision 0165). Partitions with nothing waiting are absent."""
        ...

    def expiring_batch(self, tenant_id: str, before_us: int, after: TenantCursor | None = None,
                       limit: int = 500) -> list[ExpiringFire]:
        """The next ``limit`` terminal fires of the tenant scheduled before ``before_us``, after the
        cursor, oldest first, with attempts and work outcome. Live fires are never returned."""
        ...

    def get_fire(self, key: FireKey) -> Fire | None:
        """One fire with its attempts, or None."""
        ...

    def history_fires(self, tenant_id: str, *, trigger_id: str | None = None, from_us: int | None = None,
                      to_us: int | None = None, states: Iterable[str] | None = None,
                      after: tuple[Any, ...] | None = None, limit: int = 100,
                      descending: bool = False) -> list[Fire]:
        """One page of a tenant's fires (of one trigger when ``trigger_id``), with their attempts.

        ``after`` is the last row of the previous page: ``(scheduled_us, seq)`` for one trigger,
        ``(scheduled_us, trigger_id, seq)`` for the tenant. ``states`` filters (default: every
        state; an unknown state raises ``ValueError``).
        """
        ...

    def lane_depths(self) -> dict[tuple[str, str], int]:
        """Live fires (pending / dispatching / held by overlap policy queue) per (lane, state)."""
        ...

    def lane_due_since(self, lanes: tuple[str, ...]) -> dict[str, int]:
        """Per lane of ``lanes``, the dispatch time (µs; the decision or the jittered not-before) of
        its oldest fire never attempted (pending, no attempt yet: retries do not count); lanes with
        none are absent. One index-ordered ``LIMIT 1`` per lane (index ``fires_never_attempted``):
        the cost does not grow with the backlog (decision 0165)."""
        ...

    def lateness_us(self, tenant_id: str, trigger_id: str, from_us: int, to_us: int,
                    cap: int = 200_000) -> list[int]:
        """Dispatched minus scheduled (µs) of the trigger's dispatched fires in the range, most recent
        first, at most ``cap`` of them."""
        ...

    def lease_rows(self) -> list[LeaseRow]:
        """The partition leases table, read only (the timing plane owns it)."""
        ...

    def list_fires(self, tenant_id: str, trigger_id: str, after: tuple[int, int] | None = None,
                   limit: int = 100) -> list[Fire]:
        """Fires of one trigger, oldest first, after the cursor (scheduled_us, seq), with attempts."""
        ...

    def node_rows(self) -> list[NodeRow]:
        """Running nodes (not cleanly stopped) with their last heartbeat, ε and shedding flag, read only."""
        ...

    def undecided_since(self) -> int | None:
        """The instant (µs) of the earliest due-index row (not yet decided by the timing plane), or
        None for an empty index; it is due only when not after the caller's now. One index probe."""
        ...

    def oldest_undispatched_us(self, now_us: int) -> int | None:
        """The oldest instant that is due (≤ ``now_us``) but not yet decided, or decided but not
        yet delivered; None when nothing is waiting."""
        ...

    def ops_triggers(self, tenant_id: str | None = None, after: str = "", limit: int = 1000) -> list[Trigger]:
        """Live triggers of every tenant (or of ``tenant_id``), by id: the operator's listing."""
        ...

    def purge_fires(self, keys: Sequence[FireKey]) -> int:
        """Delete these fires (terminal ones only), their attempts and work outcomes, in ONE short
        transaction; returns how many fires were deleted. Callers keep batches small."""
        ...

    def recent_states(self, tenant_id: str, trigger_id: str, n: int, before_us: int = 2**62) -> list[str]:
        """States of the trigger's last ``n`` fires scheduled before ``before_us``, newest first."""
        ...

    def smear_rows(self, tenant_id: str, lo_us: int, hi_us: int, after: tuple[int, str, int] | None = None,
                   limit: int = 5000) -> list[SmearRow]:
        """One page of the tenant's on-time scheduled fires with ``lo_us <= scheduled_us < hi_us``,
        after the cursor ``(scheduled_us, trigger_id, seq)``; pass the last row's back for the next."""
        ...

    def state_counts(self, tenant_id: str, from_us: int, to_us: int,
                     trigger_id: str | None = None) -> dict[str, int]:
        """Fires per state in the range, for the tenant or one of its triggers."""
        ...

    def tenant_ids(self) -> list[str]:
        """Every tenant id, deleted tenants included (their history expires like anyone's)."""
        ...

    def trigger_by_id(self, trigger_id: str) -> Trigger | None:
        """Any trigger by id, whatever its tenant or state (operator commands only)."""
        ...


__all__ = ["HistoryStore"]
