"""Deterministic jitter smearing (ADR-10): absorb the top-of-minute peak without moving identity.

A fire on a *popular* instant (a whole minute) may be dispatched up to ``window_s`` after its
scheduled instant, at an offset derived from the trigger id alone — the same trigger always lands at
the same point of the window, so its cadence stays regular, and the fire key (which carries the
scheduled instant) is unchanged. A window of 0 opts the trigger out. Offsets are never negative:
smearing can only make a fire later, never early.
"""

from __future__ import annotations

import hashlib

US = 1_000_000


def is_popular(scheduled_us: int) -> bool:
    """Whole-minute instants carry the peak (most cron expressions fire at second 0)."""
    return scheduled_us % (60 * US) == 0


def smear_offset_us(trigger_id: str, window_s: int) -> int:
    """The trigger's fixed offset in ``[0, window_s)`` seconds, in µs (0 when opted out)."""
    if window_s <= 0:
        return 0
    h = int.from_bytes(hashlib.blake2b(trigger_id.encode(), digest_size=8).digest(), "big")
    return h % (window_s * US)


def dispatch_not_before_us(trigger_id: str, scheduled_us: int, window_s: int) -> int | None:
    """When the fire may first be dispatched; None when no smearing applies (dispatch at once)."""
    if window_s <= 0 or not is_popular(scheduled_us):
        return None
    return scheduled_us + smear_offset_us(trigger_id, window_s)
