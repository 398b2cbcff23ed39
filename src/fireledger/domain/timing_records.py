"""The timing plane's records: partition leases and node sessions, the shadow rebuilder's rows and
reports, and the overlap facts a decision reads. Pure values (no I/O); the store's timing area
(``fireledger.store.timing``) returns them and the timing plane (``fireledger.timing``) reads them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Lease:
    """One partition's lease row (``owner`` None: free; ``handoff_to``: offered to that node first)."""

    partition: int
    owner: str | None
    epoch: int
    rev: int
    expires_us: int
    eps_us: int | None
    granted_us: int | None
    renewed_us: int | None
    released_us: int | None
    prev_owner: str | None
    handoff_to: str | None
    takeover_us: int | None
    takeover_cause: str | None


@dataclass(frozen=True, slots=True)
class NodeSession:
    """A node's session row: alive while ``heartbeat_us`` + the session TTL has not passed."""

    id: str
    role: str
    started_us: int
    heartbeat_us: int
    eps_us: int | None
    eps_source: str | None
    shedding: bool
    stopped_us: int | None


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease to take by compare-and-set on ``rev`` (the revision the granter read).

    ``takeover_us`` / ``cause`` describe the handover being completed (None for a first grant)."""

    partition: int
    rev: int
    expires_us: int
    eps_us: int
    takeover_us: int | None = None
    cause: str | None = None


@dataclass(frozen=True, slots=True)
class ShadowRow:
    """What the shadow rebuilder reads for one trigger, in one snapshot with its live due row."""

    trigger_id: str
    tenant_id: str
    state: str
    version: int
    partition: int
    schedule: dict[str, Any]
    run_start_us: int | None        # when the current schedule took effect (first version of its run)
    resumed_us: int | None          # last resume
    last_us: int | None             # last scheduled instant decided (scheduled / catch-up fires)
    due_next_us: int | None
    due_version: int | None
    due_partition: int | None
    paused_us: int | None = None    # the resume point recorded by the last pause (decision 0063)


@dataclass(frozen=True, slots=True)
class StrayDue:
    """A due row whose trigger does not exist."""

    trigger_id: str
    next_us: int
    version: int


@dataclass(frozen=True, slots=True)
class Divergence:
    """One divergent row: ``kind`` ∈ missing, orphaned, wrong_instant, wrong_version, wrong_partition."""

    partition: int
    trigger_id: str
    kind: str
    live_next_us: int | None
    live_version: int | None
    expected_next_us: int | None
    expected_version: int | None
    reported_us: int = 0
    node: str = ""


DIVERGENCE_KINDS: tuple[str, ...] = ("missing", "orphaned", "wrong_instant", "wrong_version", "wrong_partition")


@dataclass(frozen=True, slots=True)
class ShadowReport:
    """The shadow rebuilder's finding for one partition: counts by divergence kind and (when the
    report was just computed) the divergent rows themselves. ``reported_us`` 0: never checked."""

    partition: int
    node: str
    reported_us: int
    triggers: int
    live_rows: int
    counts: dict[str, int]
    repartition_pending: int
    duration_us: int
    divergences: tuple[Divergence, ...] = ()
    claimed_us: int | None = None

    def count(self, kind: str) -> int:
        return int(self.counts.get(kind, 0))

    @property
    def divergent(self) -> int:
        return sum(self.counts.get(k, 0) for k in DIVERGENCE_KINDS)


@dataclass(frozen=True, slots=True)
class RebuildStats:
    """What ``rebuild_partition`` changed: rows added, removed, moved (instant, version or partition)."""

    partition: int
    triggers: int
    rows: int
    added: int
    removed: int
    changed: int


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


@dataclass(frozen=True, slots=True)
class LeaseRow:
    partition: int
    owner: str | None
    epoch: int
    expires_us: int
    eps_us: int | None


@dataclass(frozen=True, slots=True)
class NodeRow:
    id: str
    role: str
    started_us: int
    heartbeat_us: int
    eps_us: int | None
    eps_source: str | None
    shedding: bool = False


__all__ = ["DIVERGENCE_KINDS", "Divergence", "FireFacts", "Grant", "HeldRow", "Lease", "LeaseRow", "NodeRow",
           "NodeSession", "OverlapFacts", "RebuildStats", "ShadowReport", "ShadowRow", "StrayDue"]
