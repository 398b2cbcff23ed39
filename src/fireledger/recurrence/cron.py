"""Cron expressions: validation with precise messages, and matching on naive wall time.

Parsing and field matching are cronsim's (a well-kept evaluator). We use it only on *naive* local
wall time, where it has no DST quirks; turning a matching wall time into an instant, with the
declared DST rules, is :mod:`fireledger.recurrence.schedule`'s job.

Accepted: 5 fields (minute hour day-of-month month day-of-week), 6 with leading seconds, or 7 with
leading seconds and a trailing year (Quartz order: ``sec min hour dom month dow year``, years
1970-2199); ``*``, lists, ranges, steps, month and day names, ``@hourly @daily @midnight @weekly
@monthly @yearly @annually``; ``L``, ``LW`` and ``nW`` (the weekday nearest day n, never leaving the
month: Quartz's rule) in day-of-month; ``nL`` (last weekday n of the month) and ``n#k`` in
day-of-week; ``?`` (no specific value, Quartz) standing alone in one of the two day fields, read as
``*``. Day-of-month and day-of-week combine with OR when both are restricted (neither is ``*``-led
nor ``?``), as in Vixie cron; otherwise with AND. cronsim knows neither ``nW``, ``?`` nor a year:
those three are ours (:class:`CronFields`), the rest is handed to cronsim unchanged.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
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
    ("year", 1970, 2199),
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
    if "?" in text:
        if name not in ("day-of-month", "day-of-week"):
            raise RecurrenceError(name, "? (no specific value) is allowed only in day-of-month or day-of-week")
        if text != "?":
            raise RecurrenceError(name, f"{text!r}: ? must stand alone")
        return text
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
        if name == "day-of-month" and base.endswith("W"):
            if not _is_number(base[:-1]):
                raise RecurrenceError(name, f"{base}: W needs a day number 1-31 before it (e.g. 15W)")
            _value(name, lo, hi, base[:-1])
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


@dataclass(frozen=True, slots=True)
class CronFields:
    """A validated expression, split into what cronsim evaluates and what we add to it.

    ``canonical`` is the expression as stored and shown (6 fields, or 7 with a year; upper-cased);
    ``sim`` is the 6-field text cronsim parses (``?`` read as ``*``, ``nW`` terms taken out);
    ``nearest_weekdays`` the n of every ``nW`` term; ``years`` the allowed years, or None for any;
    ``day_and`` whether day-of-month and day-of-week must both match (else either).
    """

    canonical: str
    sim: str
    nearest_weekdays: tuple[int, ...]
    years: tuple[int, ...] | None
    day_and: bool
    dom_rest: bool   # day-of-month has terms besides nW (cronsim's match_dom decides those)


def _split(expr: str) -> list[str]:
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
    elif len(parts) not in (6, 7):
        raise RecurrenceError(
            "cron", f"expected 5 fields (6 with leading seconds, 7 with seconds and a year), got {len(parts)}"
        )
    return [_check_field(name, lo, hi, part) for (name, lo, hi), part in zip(_FIELDS, parts, strict=False)]


def _expand(text: str, lo: int, hi: int) -> set[int]:
    """The values of a validated plain numeric field (the year): ``*``, lists, ranges, steps."""
    out: set[int] = set()
    for term in text.split(","):
        base, _, step = term.partition("/")
        if base == "*":
            a, b = lo, hi
        elif "-" in base:
            x, _, y = base.partition("-")
            a, b = int(x), int(y)
        else:
            a = int(base)
            b = hi if step else a
        out.update(range(a, b + 1, int(step) if step else 1))
    return out


def parse(expr: str) -> CronFields:
    """Validate ``expr`` and split it (see :class:`CronFields`).

    Raises :class:`RecurrenceError` naming the offending field (e.g. ``day-of-week: 8 is out of
    range 0-7``, ``year: 2300 is out of range 1970-2199``).
    """
    parts = _split(expr)
    if parts[3] == "?" and parts[5] == "?":
        raise RecurrenceError("day-of-week", "? in both day fields names no day: give one of them a value or *")
    years = None
    if len(parts) == 7 and parts[6] != "*":
        years = tuple(sorted(_expand(parts[6], 1970, 2199)))
    dom_terms = parts[3].replace("?", "*").split(",")
    nearest = tuple(sorted({int(t[:-1]) for t in dom_terms if t.endswith("W") and t != "LW"}))
    rest = [t for t in dom_terms if not (t.endswith("W") and t != "LW")]
    sim = [p if p != "?" else "*" for p in parts[:6]]
    sim[3] = ",".join(rest) if rest else "*"
    day_and = parts[3].startswith(("*", "?")) or parts[5].startswith(("*", "?"))
    return CronFields(" ".join(parts), " ".join(sim), nearest, years, day_and, bool(rest))


def normalise(expr: str) -> str:
    """Validate ``expr`` and return it as a 6-field expression (seconds first), upper-cased — or 7
    fields when it carries a year.

    Raises :class:`RecurrenceError` naming the offending field (e.g. ``day-of-week: 8 is out of
    range 0-7``), or :class:`NoMatchError` for an expression that can never match (``0 0 30 2 *``).
    """
    return parse(expr).canonical


def nearest_weekday(year: int, month: int, n: int) -> int | None:
    """Quartz's ``nW``: the day of the month that is the weekday (Mon-Fri) nearest day ``n``, never
    leaving the month (``1W`` on a Saturday is Monday the 3rd; ``31W`` on a Sunday is Friday the
    29th); None when the month has no day ``n``."""
    first_dow, last = calendar.monthrange(year, month)
    if n > last:
        return None
    dow = (first_dow + n - 1) % 7   # Monday = 0
    if dow == 5:    # Saturday: the Friday before, unless that is in the previous month
        return n - 1 if n > 1 else n + 2
    if dow == 6:    # Sunday: the Monday after, unless that is in the next month
        return n + 1 if n < last else n - 2
    return n


def _day_matcher(fields: CronFields, sim: CronSim) -> Callable[[date], bool]:
    """The date predicate: cronsim's own when there is no ``nW`` term, else ours around it."""
    if not fields.nearest_weekdays:
        return sim.match_day
    nearest, dom_rest, day_and = fields.nearest_weekdays, fields.dom_rest, fields.day_and
    match_dom, match_dow = sim.match_dom, sim.match_dow

    def match_day(d: date) -> bool:
        dom = (dom_rest and match_dom(d)) or any(nearest_weekday(d.year, d.month, n) == d.day for n in nearest)
        return (dom and match_dow(d)) if day_and else (dom or match_dow(d))

    return match_day


class WallMatcher:
    """A compiled cron expression that finds matching *naive wall times*.

    cronsim parses the expression into field sets and decides whether a *date* matches (month,
    day-of-month, day-of-week with ``L``/``LW``/``#`` and the Vixie OR rule); ``nW`` and the year
    are ours (:func:`parse`). The time of day is found here by bisecting the sorted
    hour/minute/second sets, which is several times faster than stepping (see
    docs/decisions/0002-cron-evaluator.md).
    """

    __slots__ = ("_hours", "_match_day", "_minutes", "_months", "_seconds", "_sim", "_years", "expression",
                 "fields")

    def __init__(self, expr: str) -> None:
        self.fields = parse(expr)
        self.expression = self.fields.canonical
        try:
            sim = CronSim(self.fields.sim, datetime(2000, 1, 1))
        except CronSimError:
            # Our validation passed, so the only remaining refusal is a day that never exists.
            raise NoMatchError(
                "cron", f"{expr.strip()!r} never matches (no such day in the months it names)"
            ) from None
        self._sim = sim
        self._match_day = _day_matcher(self.fields, sim)
        self._seconds = sorted(sim.seconds)
        self._minutes = sorted(sim.minutes)
        self._hours = sorted(sim.hours)
        self._months = frozenset(sim.months)
        self._years = self.fields.years
        # Refuse expressions that never match (0 0 31 4,6 *): probe once from a fixed point (before
        # the first year it names, if it names years).
        probe = datetime(2000, 1, 1) if self._years is None else datetime(self._years[0] - 1, 12, 31)
        try:
            found = self.next_wall(probe)
        except NoMatchError:
            found = None
        if found is None:
            within = "in the years it names" if self._years is not None else "within 50 years"
            raise NoMatchError("cron", f"{expr.strip()!r} never matches {within}")

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

    def _next_year(self, year: int) -> int | None:
        """The first allowed year >= ``year`` (``year`` itself when the expression names none)."""
        years = self._years
        if years is None:
            return year
        i = bisect_left(years, year)
        return years[i] if i < len(years) else None

    def next_wall(self, wall: datetime) -> datetime | None:
        """The first matching wall time strictly after naive ``wall`` (whole seconds), or None when
        the expression names years and the last of them is over (the recurrence is exhausted).

        Raises :class:`NoMatchError` when nothing matches within 50 years (within the years named).
        """
        try:
            start = wall.replace(microsecond=0, tzinfo=None) + _ONE_S
        except OverflowError:
            raise NoMatchError("cron", f"no time matches {self.expression!r} before the year 10000") from None
        day = start.date()
        hms: tuple[int, int, int] = (start.hour, start.minute, start.second)
        years = self._years
        if years is not None:
            y = self._next_year(day.year)
            if y is None:
                return None
            if y != day.year:
                day, hms = date(y, 1, 1), (0, 0, 0)
            limit = date(years[-1] + 1, 1, 1)
        else:
            # Capped so that neither the day nor the month step below can run past 9999-12-31.
            limit = day.replace(year=day.year + 50, day=1) if day.year + 50 <= MAXYEAR else _LAST_MONTH
        match_day = self._match_day
        months = self._months
        while day < limit:
            if years is not None and day.month == 1 and day.day == 1 and day.year not in years:
                y = self._next_year(day.year)
                if y is None:
                    return None
                day, hms = date(y, 1, 1), (0, 0, 0)
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
        if years is not None:
            return None
        raise NoMatchError(
            "cron", f"no time matches {self.expression!r} within 50 years after {wall.isoformat()}"
        )
