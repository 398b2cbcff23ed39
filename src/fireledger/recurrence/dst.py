"""DST labels: which instants of a recurrence came from a wall time that was skipped or repeated.

``dst_label(rec, instant)`` says, for an instant the recurrence yields, whether the compiler reached
it from a wall time that does not exist in the zone (``gap``: the instant is the moment the clock
jumps, DESIGN.md invariant 6) or from the first pass of a wall time that occurs twice (``fold``),
and which wall time was asked for. It is the compiler's own answer (:func:`next_occurrence` just
before the instant), so a label can never disagree with the instants the timing loop fires.

The label is stored with each fire as one short text, ``"gap 2027-03-28T01:30"`` (the wall time
to the minute, ``:SS`` added when its seconds are not zero); :func:`parse_dst_label` gives the
API's ``{"kind": "gap", "wall": "2027-03-28T01:30"}`` back. When several wall times of one gap
collapse into one instant, the label names the first of them (the one the compiler resolved).

Pure: no clock, no I/O. Intervals and one-shots are absolute instants: never labelled.
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from .schedule import CronRecurrence, Recurrence, UnionRecurrence, next_occurrence

_ONE_US = timedelta(microseconds=1)
_ONE_S = timedelta(seconds=1)
#: A repeated wall time lies at most this long before its zone's fall-back transition (the largest
#: backward jump in tzdata is a day, on the date line; DST ones are an hour or less).
_MAX_FOLD = timedelta(hours=25)
_KINDS = ("gap", "fold")
_HOUR_S = 3_600
_WINDOW_S = 26 * _HOUR_S   # 25 h of fold reach, plus the hour a sampled change may lie before its sample
#: (zone, year) → the hourly samples (UTC seconds) at which the zone's offset differs from the hour
#: before, from two days before the year to two days after; bounded, cleared when full. Zones are the
#: long-lived ``load_zone`` objects (and the few of a ``tzdata diff`` run).
_CHANGES: dict[tuple[ZoneInfo, int], tuple[int, ...]] = {}
_CHANGES_MAX = 4_096


def _changes(zone: ZoneInfo, year: int) -> tuple[int, ...]:
    key = (zone, year)
    got = _CHANGES.get(key)
    if got is None:
        lo = int(datetime(year, 1, 1, tzinfo=UTC).timestamp()) - 2 * 86_400
        hi = int(datetime(year, 12, 31, tzinfo=UTC).timestamp()) + 3 * 86_400
        out: list[int] = []
        prev = datetime.fromtimestamp(lo, zone).utcoffset()
        for t in range(lo + _HOUR_S, hi + 1, _HOUR_S):
            off = datetime.fromtimestamp(t, zone).utcoffset()
            if off != prev:
                out.append(t)
                prev = off
        got = tuple(out)
        if len(_CHANGES) >= _CHANGES_MAX:
            _CHANGES.clear()
        _CHANGES[key] = got
    return got


def _near_change(zone: ZoneInfo, instant: datetime) -> bool:
    """Whether ``zone``'s offset may change in (instant − 1 s, instant + 25 h]: a bisect in the
    zone-year's hourly change samples, computed once per (zone, year) (a transition pair closer than
    an hour, which would cancel between two samples, does not occur in tzdata)."""
    try:
        changes = _changes(zone, instant.year)
    except (OverflowError, ValueError, OSError):
        return True     # at the edges of the representable range: let the exact check decide
    t = instant.timestamp()
    i = bisect_right(changes, t - 1)
    return i < len(changes) and changes[i] <= t + _WINDOW_S


def dst_label(rec: Recurrence, instant: datetime) -> str | None:
    """The stored DST label of ``instant`` (aware) under ``rec``: ``"gap <wall>"``, ``"fold <wall>"``,
    or None — for a wall time that exists once, for an instant the recurrence does not yield, and
    for every interval and one-shot. Instants not within a day before an offset change are answered
    None by a bisect in the zone-year's offset changes (cached), so most calls neither convert nor
    search. A union of specs (decision 0155) carries the label of the first cron spec that yields
    ``instant`` from a gap or a fold."""
    if isinstance(rec, UnionRecurrence):
        return next((lab for m in rec.members if (lab := dst_label(m, instant)) is not None), None)
    if not isinstance(rec, CronRecurrence):
        return None
    zone = rec.zone
    try:
        if not _near_change(zone, instant):
            return None
        before = (instant - _ONE_S).astimezone(zone).utcoffset()
        after = (instant + _MAX_FOLD).astimezone(zone).utcoffset()
    except OverflowError:
        return None
    if before == after:
        # No offset change in (instant - 1 s, instant + 25 h]: the instant is neither a jump nor
        # in a repeated hour (two changes that cancel within a day do not occur in tzdata).
        return None
    occ = next_occurrence(rec, instant - _ONE_US)
    if occ is None or occ.instant != instant or occ.note is None or occ.wall is None:
        return None
    return f"{occ.note} {format_wall(occ.wall)}"


def dst_label_us(rec: Recurrence, instant_us: int) -> str | None:
    """:func:`dst_label` for an instant in integer microseconds since the epoch (what fires store)."""
    if not isinstance(rec, CronRecurrence | UnionRecurrence):
        return None
    return dst_label(rec, datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=instant_us))


def format_wall(wall: datetime) -> str:
    """A wall time as the label writes it: ``YYYY-MM-DDTHH:MM``, ``:SS`` when the seconds are not 0."""
    text = wall.strftime("%Y-%m-%dT%H:%M")
    return f"{text}:{wall.second:02d}" if wall.second else text


def parse_dst_label(text: str | None) -> dict[str, Any] | None:
    """The API form of a stored label: ``{"kind": "gap"|"fold", "wall": "…"}``; None for None (no
    label, or a fire decided before labels were recorded) and for text that is not a label."""
    if not text:
        return None
    kind, _, wall = text.partition(" ")
    if kind not in _KINDS or not wall:
        return None
    return {"kind": kind, "wall": wall}


__all__ = ["dst_label", "dst_label_us", "format_wall", "parse_dst_label"]
