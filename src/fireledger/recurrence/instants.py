"""Instants and durations at the boundary: RFC 3339 UTC instants and duration strings.

Instants inside fireledger are timezone-aware :class:`datetime` objects in UTC. On the wire they are
RFC 3339 with a ``Z`` suffix (fractional seconds only when non-zero).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from .errors import RecurrenceError

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$",
    re.ASCII,  # \d alone also matches "２" and "٥", which int() accepts
)
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d)", re.ASCII)
_UNIT_US = {"ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}


def parse_instant(text: str, field: str = "instant") -> datetime:
    """Parse an RFC 3339 instant that carries an offset; return it as an aware UTC datetime.

    Raises :class:`RecurrenceError` naming ``field`` for anything else (a naive time is refused:
    an instant without an offset is not an instant).
    """
    if not isinstance(text, str):
        raise RecurrenceError(field, "must be an RFC 3339 string such as 2026-03-29T01:30:00Z")
    m = _RFC3339.match(text.strip())
    if not m:
        raise RecurrenceError(
            field, f"{text!r} is not an RFC 3339 instant with an offset (e.g. 2026-03-29T01:30:00Z)"
        )
    frac = m.group(7)
    micro = int((frac[1:] + "000000")[:6]) if frac else 0
    off = m.group(8)
    try:
        if off in ("Z", "z"):
            tz = UTC
        else:
            sign = 1 if off[0] == "+" else -1
            hours, minutes = int(off[1:3]), int(off[4:6])
            if hours > 23 or minutes > 59:
                raise ValueError("offset out of range")
            from datetime import timezone

            tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
        dt = datetime(
            int(m.group(1)), int(m.group(2)), int(m.group(3)),
            int(m.group(4)), int(m.group(5)), int(m.group(6)), micro, tzinfo=tz,
        )
        return dt.astimezone(UTC)
    except ValueError as exc:
        raise RecurrenceError(field, f"{text!r} is not a valid instant ({exc})") from None
    except OverflowError:
        raise RecurrenceError(field, f"{text!r} is outside the years 0001-9999 in UTC") from None


def format_instant(dt: datetime) -> str:
    """Format an aware datetime as RFC 3339 UTC with a ``Z`` suffix."""
    u = dt.astimezone(UTC)
    # Not strftime("%Y"): it drops the leading zeros of years before 1000 on glibc.
    text = f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}"
    if u.microsecond:
        return f"{text}.{u.microsecond:06d}Z"
    return f"{text}Z"


def parse_duration(text: str, field: str = "duration", *, minimum: timedelta | None = None,
                   maximum: timedelta | None = None) -> timedelta:
    """Parse a duration string such as ``90s``, ``15m``, ``1h``, ``1h30m``, ``500ms`` or ``2d``.

    Raises :class:`RecurrenceError` naming ``field`` when the text is not a duration or lies outside
    ``[minimum, maximum]``.
    """
    if not isinstance(text, str) or not text.strip():
        raise RecurrenceError(field, "must be a duration string such as 90s, 15m, 1h")
    s = text.strip()
    pos = 0
    total = 0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNIT_US[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise RecurrenceError(
            field, f"{text!r} is not a duration (use a number and a unit: ms, s, m, h, d; e.g. 90s)"
        )
    try:
        value = timedelta(microseconds=total)
    except OverflowError:
        raise RecurrenceError(field, f"{text!r} is too long") from None
    if minimum is not None and value < minimum:
        raise RecurrenceError(field, f"{text!r} is shorter than the minimum {format_duration(minimum)}")
    if maximum is not None and value > maximum:
        raise RecurrenceError(field, f"{text!r} is longer than the maximum {format_duration(maximum)}")
    return value


def format_duration(value: timedelta) -> str:
    """Format a duration in the shortest form parse_duration reads back (e.g. ``1h30m``)."""
    us = value // timedelta(microseconds=1)  # exact; value / timedelta is a float
    if us == 0:
        return "0s"
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        n, us = divmod(us, _UNIT_US[unit])
        if n:
            parts.append(f"{n}{unit}")
    if us:
        parts.append(f"{us}us")  # not parseable; only for sub-millisecond values, which we refuse
    return "".join(parts)
