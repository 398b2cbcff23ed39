"""Exclusion calendars: named lists of dates, date ranges and cron-shaped exclusions, each in a zone.

A calendar's entries, as the API takes them (decision 0156):

* ``{"date": "2026-12-25", "zone": "Europe/London"}`` — every instant whose local date is that day;
* ``{"from": "2026-12-24", "to": "2027-01-01", "zone": …}`` — local dates from ``from`` to ``to``,
  both included;
* ``{"cron": "* * 25 12 *", "zone": …}`` — every minute whose local wall time matches the 5-field
  expression (minute hour day-of-month month day-of-week: "every 25 Dec" is ``* * 25 12 *``);

each with an optional ``label`` (shown in causes) and ``zone`` (default UTC). An instant is matched
by its actual local time in the entry's zone (``instant.astimezone(zone)``): DST plays no further
part. :func:`excluded` names the first calendar and entry that excludes an instant. Pure: no clock,
no I/O; the planes read the calendars and apply them (an excluded instant is recorded ``skipped``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from .cron import ALIASES, WallMatcher
from .errors import RecurrenceError
from .zones import load_zone

#: Entries per calendar at most.
MAX_ENTRIES = 1000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", re.ASCII)
_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$", re.ASCII)
_ENTRY_KEYS = {"date", "from", "to", "cron", "zone", "label"}
_MAX_LABEL = 100
_ONE_MIN = timedelta(minutes=1)


def name_problem(name: Any) -> str | None:
    """What is wrong with a calendar name (None: nothing): 1-64 of letters, digits, ``_ . -``, not
    starting with a punctuation mark."""
    if not isinstance(name, str) or not _NAME.match(name):
        return "must be a calendar name: 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
    return None


@dataclass(frozen=True, slots=True)
class Exclusion:
    """One compiled entry (``index``: its position in the calendar's ``entries``)."""

    index: int
    kind: Literal["date", "range", "cron"]
    zone_name: str
    first: date | None = None
    last: date | None = None
    matcher: WallMatcher | None = field(default=None, repr=False, compare=False)
    label: str | None = None
    zone: ZoneInfo = field(default=ZoneInfo("UTC"), repr=False, compare=False)

    def excludes(self, instant: datetime) -> bool:
        """Whether the aware ``instant`` falls in this entry (its local time in the entry's zone)."""
        local = instant.astimezone(self.zone).replace(tzinfo=None)
        if self.matcher is None:
            assert self.first is not None and self.last is not None
            return self.first <= local.date() <= self.last
        minute = local.replace(second=0, microsecond=0)
        return self.matcher.next_wall(minute - _ONE_MIN) == minute

    def describe(self) -> str:
        """The entry in words for a cause: ``entry 2 (2026-12-25 in Europe/London, "Christmas")``."""
        if self.kind == "date":
            what = f"{self.first}"
        elif self.kind == "range":
            what = f"{self.first} to {self.last}"
        else:
            assert self.matcher is not None
            what = f"cron {' '.join(self.matcher.expression.split()[1:6])}"
        label = f", {self.label!r}" if self.label else ""
        return f"entry {self.index} ({what} in {self.zone_name}{label})"


@dataclass(frozen=True, slots=True)
class Calendar:
    """A compiled calendar: its name and its entries."""

    name: str
    entries: tuple[Exclusion, ...]

    def first_excluding(self, instant: datetime) -> Exclusion | None:
        """The first entry that excludes ``instant``, or None."""
        for e in self.entries:
            if e.excludes(instant):
                return e
        return None


def _date(value: Any, where: str) -> date:
    m = _DATE.match(value) if isinstance(value, str) else None
    if m is None:
        raise RecurrenceError(where, "must be a date YYYY-MM-DD")
    try:
        return date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError as exc:
        raise RecurrenceError(where, f"{value!r} is not a date ({exc})") from None


def _entry(i: int, raw: Any) -> Exclusion:
    where = f"entries[{i}]"
    if not isinstance(raw, Mapping):
        raise RecurrenceError(where, "must be an object with one of date, from/to, cron")
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        raise RecurrenceError(f"{where}.{unknown[0]}", "is not a calendar entry field (date, from, to, cron, "
                                                       "zone, label)")
    forms = [k for k in ("date", "from", "cron") if k in raw]
    if len(forms) != 1 or ("to" in raw) != ("from" in raw):
        raise RecurrenceError(where, "must have exactly one of date, from and to (a range), cron")
    zone_name = raw.get("zone", "UTC")
    label = raw.get("label")
    if label is not None and (not isinstance(label, str) or len(label) > _MAX_LABEL
                              or any(not ch.isprintable() for ch in label)):
        raise RecurrenceError(f"{where}.label", f"must be printable text of at most {_MAX_LABEL} characters")
    try:
        zone = load_zone(zone_name)
    except RecurrenceError as exc:
        raise RecurrenceError(f"{where}.zone", exc.problem) from None
    if forms[0] == "date":
        d = _date(raw["date"], f"{where}.date")
        return Exclusion(i, "date", zone_name, d, d, label=label, zone=zone)
    if forms[0] == "from":
        lo, hi = _date(raw["from"], f"{where}.from"), _date(raw["to"], f"{where}.to")
        if hi < lo:
            raise RecurrenceError(f"{where}.to", "is before from")
        return Exclusion(i, "range", zone_name, lo, hi, label=label, zone=zone)
    expr = raw["cron"]
    text = ALIASES.get(expr.strip().lower(), expr) if isinstance(expr, str) else expr
    if not isinstance(text, str) or len(text.split()) != 5:
        raise RecurrenceError(f"{where}.cron", "must be a 5-field cron expression (minute hour day-of-month "
                                               "month day-of-week), e.g. '* * 25 12 *' for every 25 December")
    try:
        matcher = WallMatcher(text)
    except RecurrenceError as exc:
        raise RecurrenceError(f"{where}.cron", f"{exc.field}: {exc.problem}" if exc.field != "cron"
                              else exc.problem) from None
    return Exclusion(i, "cron", zone_name, matcher=matcher, label=label, zone=zone)


def compile_calendar(name: str, entries: Any) -> Calendar:
    """Compile a calendar from its API form. Raises :class:`RecurrenceError` naming ``name`` or
    ``entries[i].<field>``."""
    problem = name_problem(name)
    if problem:
        raise RecurrenceError("name", problem)
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise RecurrenceError("entries", f"must be a list of at most {MAX_ENTRIES} entries")
    return Calendar(name, tuple(_entry(i, e) for i, e in enumerate(entries)))


def excluded(calendars: Sequence[Calendar], instant: datetime) -> tuple[Calendar, Exclusion] | None:
    """The first calendar (in the order the schedule names them) and entry that exclude ``instant``."""
    for cal in calendars:
        e = cal.first_excluding(instant)
        if e is not None:
            return cal, e
    return None


def exclusion_cause(cal: Calendar, e: Exclusion) -> str:
    """The recorded cause of an excluded instant (names the calendar and the entry)."""
    return f"skipped: excluded by calendar {cal.name!r} {e.describe()}"


__all__ = ["MAX_ENTRIES", "Calendar", "Exclusion", "compile_calendar", "excluded", "exclusion_cause",
           "name_problem"]
