"""Cron expressions: validation with precise messages, and matching on naive wall time.

Parsing and field matching are cronsim's (a well-kept evaluator). We use it only on *naive* local
wall time, where it has no DST quirks; turning a matching wall time into an instant, with the
declared DST rules, is :mod:`fireledger.recurrence.schedule`'s job.

Accepted: 5 fields (minute hour day-of-month month day-of-week) or 6 with leading seconds; ``*``,
lists, ranges, steps, month and day names, ``@hourly @daily @midnight @weekly @monthly @yearly
@annually``; ``L`` and ``LW`` in day-of-month; ``nL`` (last weekday n of the month) and ``n#k`` in
day-of-week. Day-of-month and day-of-week combine with OR when both are restricted (neither starts
with ``*``), as in Vixie cron; otherwise with AND.
"""

from __future__ import annotations

from bisect import bisect_left
from datetime import MAXYEAR, date, datetime, timedelta

from cronsim import CronSim, CronSimError

from .errors import NoMatchError, RecurrenceError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_FIELDS = [
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
]
_MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
_DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
_MAX_EXPR_LEN = 256
_ONE_S = timedelta(seconds=1)
_ONE_DAY = timedelta(days=1)
_32_DAYS = timedelta(days=32)
_LAST_MONTH = date(MAXYEAR, 12, 1)


def _value(name: str, lo: int, hi: int, token: str) -> int:
    if name == "month" and token in _MONTHS:
        return _MONTHS.index(token) + 1
    if name == "day-of-week" and token in _DAYS:
        return _DAYS.index(token)
    if not _is_number(token):
        if token == "":
            raise RecurrenceError(name, "a value is missing")
        raise RecurrenceError(name, f"{token!r} is not a number{_names_hint(name)}")
    v = int(token)
    if not lo <= v <= hi:
        raise RecurrenceError(name, f"{v} is out of range {lo}-{hi}")
    return v


def _is_number(token: str) -> bool:
    # str.isdigit() is true for "²" and "١", which int() or cronsim then refuse: ASCII digits only.
    return token.isascii() and token.isdigit()


def _names_hint(name: str) -> str:
    if name == "month":
        return " or a month name (JAN-DEC)"
    if name == "day-of-week":
        return " or a day name (SUN-SAT)"
    return ""


def _check_field(name: str, lo: int, hi: int, text: str) -> str:
    """Validate one field; return it with degenerate stepped ranges (``5-5/2``) collapsed to ``5``.

    cronsim reads a one-value range with a step as "from there to the end of the field" (``5-5/2``
    would be 5,7,9,…,59); cron means the single value.
    """
    terms = []
    for term in text.split(","):
        terms.append(term)
        if term == "":
            raise RecurrenceError(name, f"empty item in list {text!r}")
        base, slash, step = term.partition("/")
        if slash:
            if not _is_number(step) or int(step) == 0:
                raise RecurrenceError(name, f"step {step!r} must be a whole number of at least 1")
            if int(step) > hi:
                raise RecurrenceError(name, f"step {step} is larger than the field's range {lo}-{hi}")
        if base == "*":
            continue
        if name == "day-of-month" and base in ("L", "LW"):
            if slash:
                raise RecurrenceError(name, f"{base} cannot take a step")
            continue
        if name == "day-of-week" and base.endswith("L") and len(base) > 1:
            if not _is_number(base[:-1]):
                raise RecurrenceError(name, f"{base}: L needs a day number 0-7 before it (e.g. 5L)")
            _value(name, lo, hi, base[:-1])
            if slash or len(text.split(",")) > 1:
                raise RecurrenceError(name, f"{base} must stand alone")
            continue
        if name == "day-of-week" and "#" in base:
            day, _, nth = base.partition("#")
            _value(name, lo, hi, day)
            if slash:
                raise RecurrenceError(name, f"{base} cannot take a step")
            if not _is_number(nth) or not 1 <= int(nth) <= 5:
                raise RecurrenceError(name, f"#{nth} must be #1 to #5")
            continue
        if "-" in base:
            a, _, b = base.partition("-")
            va, vb = _value(name, lo, hi, a), _value(name, lo, hi, b)
            if vb < va:
                raise RecurrenceError(name, f"range {base} runs backwards")
            if va == vb and slash:
                terms[-1] = a
            continue
        _value(name, lo, hi, base)
    return ",".join(terms)


def normalise(expr: str) -> str:
    """Validate ``expr`` and return it as a 6-field expression (seconds first), upper-cased.

    Raises :class:`RecurrenceError` naming the offending field (e.g. ``day-of-week: 8 is out of
    range 0-7``), or :class:`NoMatchError` for an expression that can never match (``0 0 30 2 *``).
    """
    if not isinstance(expr, str) or not expr.strip():
        raise RecurrenceError("cron", "the expression is empty")
    if len(expr) > _MAX_EXPR_LEN:
        raise RecurrenceError("cron", f"the expression is longer than {_MAX_EXPR_LEN} characters")
    text = expr.strip()
    if text.startswith("@"):
        alias = ALIASES.get(text.lower())
        if alias is None:
            raise RecurrenceError("cron", f"unknown alias {text!r} (known: {', '.join(sorted(ALIASES))})")
        text = alias
    parts = text.upper().split()
    if len(parts) == 5:
        parts.insert(0, "0")
    elif len(parts) != 6:
        raise RecurrenceError(
            "cron", f"expected 5 fields (or 6 with leading seconds), got {len(parts)}"
        )
    parts = [_check_field(name, lo, hi, part) for (name, lo, hi), part in zip(_FIELDS, parts, strict=True)]
    return " ".join(parts)


class WallMatcher:
    """A compiled cron expression that finds matching *naive wall times*.

    cronsim parses the expression into field sets and decides whether a *date* matches (month,
    day-of-month, day-of-week with ``L``/``LW``/``#`` and the Vixie OR rule). The time of day is
    found here by bisecting the sorted hour/minute/second sets, which is several times faster than
    stepping (see docs/decisions/0002-cron-evaluator.md).
    """

    __slots__ = ("_hours", "_minutes", "_months", "_seconds", "_sim", "expression")

    def __init__(self, expr: str) -> None:
        self.expression = normalise(expr)
        try:
            sim = CronSim(self.expression, datetime(2000, 1, 1))
        except CronSimError:
            # Our validation passed, so the only remaining refusal is a day that never exists.
            raise NoMatchError(
                "cron", f"{expr.strip()!r} never matches (no such day in the months it names)"
            ) from None
        self._sim = sim
        self._seconds = sorted(sim.seconds)
        self._minutes = sorted(sim.minutes)
        self._hours = sorted(sim.hours)
        self._months = frozenset(sim.months)
        # Refuse expressions that never match (0 0 31 4,6 *): probe once from a fixed point.
        self.next_wall(datetime(2000, 1, 1))

    def _time_on_or_after(self, h: int, m: int, s: int) -> tuple[int, int, int] | None:
        """Smallest matching (hour, minute, second) >= (h, m, s) within one day, or None."""
        hours, minutes, seconds = self._hours, self._minutes, self._seconds
        i = bisect_left(hours, h)
        if i < len(hours) and hours[i] == h:
            j = bisect_left(minutes, m)
            if j < len(minutes) and minutes[j] == m:
                k = bisect_left(seconds, s)
                if k < len(seconds):
                    return h, m, seconds[k]
                j += 1
            if j < len(minutes):
                return h, minutes[j], seconds[0]
            i += 1
        if i < len(hours):
            return hours[i], minutes[0], seconds[0]
        return None

    def next_wall(self, wall: datetime) -> datetime:
        """The first matching wall time strictly after naive ``wall`` (whole seconds).

        Raises :class:`NoMatchError` when nothing matches within 50 years.
        """
        try:
            start = wall.replace(microsecond=0, tzinfo=None) + _ONE_S
        except OverflowError:
            raise NoMatchError("cron", f"no time matches {self.expression!r} before the year 10000") from None
        day = start.date()
        # Capped so that neither the day nor the month step below can run past 9999-12-31.
        limit = day.replace(year=day.year + 50, day=1) if day.year + 50 <= MAXYEAR else _LAST_MONTH
        match_day = self._sim.match_day
        months = self._months
        hms: tuple[int, int, int] = (start.hour, start.minute, start.second)
        while day < limit:
            if day.month not in months:
                day = (day.replace(day=1) + _32_DAYS).replace(day=1)
                hms = (0, 0, 0)
                continue
            if match_day(day):
                t = self._time_on_or_after(*hms) if hms != (0, 0, 0) else (
                    self._hours[0], self._minutes[0], self._seconds[0])
                if t is not None:
                    return datetime(day.year, day.month, day.day, t[0], t[1], t[2])
            day += _ONE_DAY
            hms = (0, 0, 0)
        raise NoMatchError(
            "cron", f"no time matches {self.expression!r} within 50 years after {wall.isoformat()}"
        )
