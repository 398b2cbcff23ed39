"""Deterministic jitter smearing (ADR-10): absorb the top-of-minute peak without moving identity.

A fire on a *popular* instant (a whole minute) may be dispatched up to ``window_s`` after its
scheduled instant, at an offset derived from the trigger id alone — the same trigger always lands at
the same point of the window, so its cadence stays regular, and the fire key (which carries the
scheduled instant) is unchanged. A window of 0 opts the trigger out. Offsets are never negative:
smearing can only make a fire later, never early.

Smearing never reorders a trigger's own fires (decision 0145): the offset of a fire stays below
half the gap to the trigger's next instant (``next_us``). Only a trigger whose instants are closer
than twice its window is affected (a 2 s interval with the default 10 s window: offsets in
[0, 1 s)); there the offset is the trigger's own, brought into the cap (``h mod cap``) when it
exceeds it. With the next instant's offset ≥ 0, ``u + offset(u) < u + (v − u)/2 < v ≤ v +
offset(v)``: the order of dispatch is the order of the instants.
"""

from __future__ import annotations

import hashlib

US = 1_000_000


def is_popular(scheduled_us: int) -> bool:
    """Whole-minute instants carry the peak (most cron expressions fire at second 0)."""
    return scheduled_us % (60 * US) == 0


def _hash(trigger_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(trigger_id.encode(), digest_size=8).digest(), "big")


def smear_cap_us(scheduled_us: int, next_us: int | None) -> int | None:
    """The largest offset + 1 µs the fire at ``scheduled_us`` may take: half the gap to the
    trigger's next instant (None: no next instant, no cap)."""
    if next_us is None:
        return None
    return max(1, (next_us - scheduled_us) // 2)


def smear_offset_us(trigger_id: str, window_s: int, cap_us: int | None = None) -> int:
    """The trigger's fixed offset in ``[0, window_s)`` seconds, in µs (0 when opted out), brought
    below ``cap_us`` when given and smaller than the window."""
    if window_s <= 0:
        return 0
    h = _hash(trigger_id)
    offset = h % (window_s * US)
    if cap_us is not None and offset >= cap_us:
        offset = h % cap_us
    return offset


def is_capped(scheduled_us: int, window_s: int, next_us: int | None) -> bool:
    """Whether the cap is narrower than the declared window for this fire (it may still leave the
    trigger's own offset unchanged, when that offset is already below it)."""
    cap = smear_cap_us(scheduled_us, next_us)
    return window_s > 0 and is_popular(scheduled_us) and cap is not None and cap < window_s * US


def dispatch_not_before_us(trigger_id: str, scheduled_us: int, window_s: int,
                           next_us: int | None = None) -> int | None:
    """When the fire may first be dispatched; None when no smearing applies (dispatch at once).

    ``next_us`` is the trigger's next instant after ``scheduled_us`` (None: none, or unknown): the
    offset stays below half the gap to it, so the trigger's fires are dispatched in order.
    """
    if window_s <= 0 or not is_popular(scheduled_us):
        return None
    return scheduled_us + smear_offset_us(trigger_id, window_s, smear_cap_us(scheduled_us, next_us))
