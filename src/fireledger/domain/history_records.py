"""History's records: the fire states a filter may name and a terminal fire past retention. Pure values."""

from __future__ import annotations

from dataclasses import dataclass

from .model import Fire, FireState

#: Every fire state, in a fixed order (the state filter binds exactly this many placeholders).
ALL_STATES: tuple[str, ...] = tuple(s.value for s in FireState)


TERMINAL: tuple[str, ...] = ("delivered", "failed", "unknown", "expired", "skipped")


@dataclass(frozen=True, slots=True)
class ExpiringFire:
    """A terminal fire past the retention cutoff, with its attempts and reported work outcome."""

    fire: Fire
    outcome: str | None
    outcome_reported_us: int | None


#: A per-tenant history cursor: (scheduled_us, trigger_id, seq).
TenantCursor = tuple[int, str, int]


__all__ = ["ALL_STATES", "TERMINAL", "ExpiringFire", "TenantCursor"]
