"""When the timing loop does what: the sleep after a cycle, the gather window's floor (decisions
0150, 0227) and whether a cycle reads the held fires (decision 0229). Pure arithmetic on instants
and monotonic seconds, no clock read and no store here.
"""

from __future__ import annotations

from typing import Protocol


class CycleFacts(Protocol):
    """What the pacing reads of a cycle's result (:class:`~fireledger.timing.loop.TickResult`)."""

    claimed_rows: int
    earliest_us: int


def sleep_after(res: CycleFacts, next_due_us: int | None, earliest_now_us: int, max_sleep_s: float) -> float:
    """Seconds to sleep after a cycle: until the next due instant (at most ``max_sleep_s``).

    An instant already due is claimed at once — unless it was due at the cycle's own clock bound and
    the cycle still claimed nothing (ownership ran out, a batch dropped): then 50 ms, not a spin; the
    lease manager wakes the loop on a grant. An instant that became due only after the cycle read
    the clock is *not* that case (it was not claimable then), and waiting 50 ms for it would make a
    fire on a busy second up to 50 ms late."""
    if next_due_us is None:
        return max_sleep_s
    delay = max(0.0, min((next_due_us - earliest_now_us) / 1e6, max_sleep_s))
    if delay == 0.0 and res.claimed_rows == 0 and next_due_us <= res.earliest_us:
        delay = min(0.05, max_sleep_s)
    return delay


def gather_floor(started: float, planned: float, gather_s: float) -> float:
    """The earliest (monotonic) start of the cycle after one that committed fires (decisions 0150,
    0227): ``gather_s`` after the committing cycle's *planned* start — when its sleep was due to end,
    or when it was woken — so the lateness of a late wake-up is not carried into the next window
    and does not ratchet up under a steady stream; but at least ``gather_s / 2`` after its actual
    start, so a cycle woken very late is not followed by a spin of small cycles."""
    return max(min(planned, started), started - gather_s / 2) + gather_s


#: With no held fire seen and no reason to look sooner, a cycle reads the held fires at least this
#: often (seconds; decision 0229).
HELD_RESCAN_S = 1.0


class HeldScan:
    """Whether a cycle reads the held fires (overlap ``queue``, decision 0060) — decision 0229.

    Held fires are made only by timing decisions. A cycle reads them (one statement, the first of the
    cycle) when one can be there to release: at the first cycle; after a cycle that committed a held
    fire; every cycle while the last read found a held fire of the partitions held (each is released
    the cycle after its previous fire finishes, as before); when the partitions held changed (a
    partition taken over may carry its former owner's held fires); and otherwise at least every
    ``every_s`` (held fires committed by another node that claims the same partitions — leases off —
    and then stopped). Under a stream with no ``queue`` trigger a cycle does not read them."""

    def __init__(self, every_s: float = HELD_RESCAN_S) -> None:
        self.every_s = every_s
        self._clear_at: float | None = None   # monotonic s of the last read that found none; None: read
        self._parts: frozenset[int] | None = None

    def due(self, mono: float, partitions: frozenset[int] | None) -> bool:
        """Whether the cycle starting at ``mono`` (holding ``partitions``; None: every partition)
        reads the held fires."""
        return self._clear_at is None or partitions != self._parts or mono - self._clear_at >= self.every_s

    def read(self, mono: float, partitions: frozenset[int] | None, found: bool) -> None:
        """A cycle read the held fires of ``partitions`` at ``mono``; ``found``: some were there."""
        self._clear_at = None if found else mono
        self._parts = partitions

    def committed_held(self) -> None:
        """A cycle committed a held fire: the next cycle reads them."""
        self._clear_at = None


__all__ = ["HELD_RESCAN_S", "CycleFacts", "HeldScan", "gather_floor", "sleep_after"]
