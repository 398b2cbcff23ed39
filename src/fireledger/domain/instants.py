"""The representable range of instants, and arithmetic on instants that never leaves it.

Every instant the store holds is an integer of microseconds since the Unix epoch. Both engines
store it as a signed 64-bit integer, and every instant must also be formattable as a timestamp
(years 0001-9999 in UTC). An instant computed from something outside the process — a target's
``Retry-After``, a tenant's timeout or horizon — is computed here, so an absurd input gives an
instant at the edge of the range instead of an error that would stall the plane recording it
(DESIGN.md invariant 15).
"""

from __future__ import annotations

import math

__all__ = ["MAX_US", "MIN_US", "after_us", "clamp_us"]

#: 0001-01-01T00:00:00Z in microseconds since the epoch (the earliest representable instant).
MIN_US = -62_135_596_800_000_000
#: 9999-12-31T23:59:59.999999Z in microseconds since the epoch (the latest representable instant).
MAX_US = 253_402_300_799_999_999


def clamp_us(us: int) -> int:
    """``us`` brought into ``[MIN_US, MAX_US]`` (an int; ``bool`` is refused with ``TypeError``)."""
    if isinstance(us, bool) or not isinstance(us, int):
        raise TypeError("an instant is an int of microseconds")
    return MIN_US if us < MIN_US else MAX_US if us > MAX_US else us


def after_us(start_us: int, seconds: float) -> int:
    """The instant ``seconds`` after ``start_us``, clamped to the representable range.

    Total for any float: ``+inf`` gives :data:`MAX_US`, ``-inf`` gives :data:`MIN_US`, NaN gives
    ``start_us`` (no delay); the microsecond count is rounded down. Never raises for a number.
    """
    start = clamp_us(start_us)
    s = float(seconds)
    if math.isnan(s):
        return start
    if s >= (MAX_US - MIN_US) / 1e6:
        return MAX_US
    if s <= -(MAX_US - MIN_US) / 1e6:
        return MIN_US
    return clamp_us(start + math.floor(s * 1e6))
