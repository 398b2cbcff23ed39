"""A schedule in words, for ``fireledger preview --explain`` (decision 0144).

The fields cronsim knows are worded by cronsim's own explainer (``cronsim.explain``); the parts it
does not know — ``nW``, ``?``, the year — and the zone and DST sentence are ours. The DST sentence
is computed, not boilerplate: it names the zone's clock changes in the year after ``at`` and says
whether the schedule has wall times inside them (and so what happens to those instants).
Pure: no clock, no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

from cronsim.explain import Expression, join, ordinal

from .cron import CronFields, WallMatcher
from .errors import NoMatchError
from .instants import format_duration, format_instant
from .schedule import CronRecurrence, IntervalRecurrence, Recurrence, UnionRecurrence, _transition

_DAY = timedelta(days=1)
_ONE_S = timedelta(seconds=1)


def explain(rec: Recurrence, at: datetime) -> str:
    """One paragraph: what the schedule fires on, in which zone, and what DST does to it in the
    year after ``at`` (aware). A union (several specs): each spec's paragraph, numbered as in
    ``specs``, and that an instant two specs share fires once."""
    if isinstance(rec, UnionRecurrence):
        parts = [f"spec {i}: {explain(m, at)}" for i, m in enumerate(rec.members)]
        return f"The union of {len(parts)} specs (an instant two of them share fires once): " + " | ".join(parts)
    if isinstance(rec, CronRecurrence):
        return f"{explain_fields(rec.matcher.fields)}, in {rec.zone_name}; DST: {_dst(rec, at)}"
    if isinstance(rec, IntervalRecurrence):
        return (f"Every {format_duration(rec.every)} from {format_instant(rec.anchor)} (absolute time); "
                f"DST: does not apply, an interval counts elapsed time, not wall time")
    return f"Once, at {format_instant(rec.at)}; DST: does not apply, the instant is absolute"


def explain_fields(fields: CronFields) -> str:
    """The cron expression in words, e.g. ``At 09:00 on Monday through Friday``."""
    e = Expression(fields.sim.split())
    time_text, allow_every_day = e.translate_time()
    if fields.nearest_weekdays:
        date_text = _w_dates(fields, e)
    else:
        date_text = e.translate_date(allow_every_day) or ("every day" if allow_every_day else "")
    text = " ".join(part for part in (time_text, date_text, _years(fields.years)) if part)
    return text[0].upper() + text[1:]


def _w_dates(fields: CronFields, e: Expression) -> str:
    near = join([f"the {ordinal(n)}" for n in fields.nearest_weekdays])
    parts = [f"on the weekday (Monday to Friday) nearest {near} of the month (within the month)"]
    if fields.dom_rest:
        parts.append(f"or {e.day}")
    if not e.dow.star:
        parts.append(f"and {e.dow}" if not fields.day_and else f"if it's {e.dow}")
    if not e.month.star:
        parts.append(str(e.month))
    return " ".join(parts)


def _years(years: tuple[int, ...] | None) -> str:
    if years is None:
        return ""
    if len(years) == 1:
        return f"in {years[0]} only"
    if years == tuple(range(years[0], years[-1] + 1)):
        return f"in the years {years[0]} through {years[-1]}"
    if len(years) <= 6:
        return f"in {join([str(y) for y in years])}"
    step = years[1] - years[0]
    if all(b - a == step for a, b in pairwise(years)):
        return f"every {ordinal(step)} year from {years[0]} through {years[-1]}"
    return f"in {len(years)} years from {years[0]} through {years[-1]}"


def _changes(zone: ZoneInfo, start: datetime, days: int = 366) -> list[tuple[datetime, timedelta, timedelta]]:
    """The zone's offset changes in ``days`` days from ``start``: (UTC instant, before, after)."""
    out = []
    t = start.astimezone(UTC).replace(tzinfo=None, microsecond=0)
    prev = zone.utcoffset(t.replace(tzinfo=UTC).astimezone(zone))
    for _ in range(days):
        nxt = t + _DAY
        cur = zone.utcoffset(nxt.replace(tzinfo=UTC).astimezone(zone))
        assert prev is not None and cur is not None
        if cur != prev:
            out.append((_transition(zone, t, nxt, cur), prev, cur))
        prev, t = cur, nxt
    return out


def _has_wall_in(matcher: WallMatcher, lo: datetime, hi: datetime) -> bool:
    """Whether a matching wall time lies in ``[lo, hi)`` (naive)."""
    try:
        found = matcher.next_wall(lo - _ONE_S)
    except NoMatchError:
        return False
    return found is not None and found < hi


def _dst(rec: CronRecurrence, at: datetime) -> str:
    changes = _changes(rec.zone, at)
    if not changes:
        return f"{rec.zone_name} has no clock change in the year from {at.astimezone(UTC):%Y-%m-%d}"
    said = []
    for t, before, after in changes:
        old_wall, new_wall = t + before, t + after
        day = f"{old_wall:%Y-%m-%d}"
        if after > before:
            lo, hi = old_wall, new_wall
            hit = _has_wall_in(rec.matcher, lo, hi)
            jump = format_instant(t.replace(tzinfo=UTC))
            what = (f"it has wall times in that gap, which fire once at the jump ({jump})" if hit
                    else "it has no wall time in that gap")
            said.append(f"clocks go forward on {day}, {lo:%H:%M}-{hi:%H:%M} does not exist and {what}")
        else:
            lo, hi = new_wall, old_wall
            hit = _has_wall_in(rec.matcher, lo, hi)
            what = ("it has wall times in it, which fire on their first pass only" if hit
                    else "it has no wall time in the repeated period")
            said.append(f"clocks go back on {day}, {lo:%H:%M}-{hi:%H:%M} occurs twice and {what}")
    return "; ".join(said)


__all__ = ["explain", "explain_fields"]
