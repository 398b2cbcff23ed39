"""Compiled recurrences and the one pure function that says when a trigger is due.

``next_after(compiled, after)`` returns the first instant strictly after ``after``, or ``None`` when
the recurrence is exhausted (a past one-shot, a closed validity window, a cron whose last named year
is over). It reads no clock and does
no I/O; the search is bounded and a recurrence that never matches raises :class:`NoMatchError`.

DST rules (DESIGN.md invariant 6), for every cron expression:

* a wall time that does not exist (spring-forward gap) fires at the instant the clock jumps to;
* a wall time that occurs twice (fall-back overlap) fires on its first occurrence only.

Several wall times in one gap therefore collapse into one instant; results are strictly increasing.
Intervals are absolute durations from an anchor and ignore wall time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from .cron import WallMatcher
from .errors import NoMatchError, RecurrenceError
from .instants import format_duration, format_instant, parse_duration, parse_instant
from .union import MAX_SPECS, earliest, member_field, renamed
from .zones import load_zone

_ONE_US = timedelta(microseconds=1)
_ONE_S = timedelta(seconds=1)
_EPOCH = datetime(1970, 1, 1)
_MIN_INTERVAL = timedelta(seconds=1)
_MAX_INTERVAL = timedelta(days=366 * 50)
#: Bounded search: a cron search walks at most this many candidate wall times per call.
_MAX_CANDIDATES = 64

Note = Literal["gap", "fold"] | None


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One instant of a recurrence, with the wall time it was computed from.

    ``note`` is ``"gap"`` when the wall time does not exist in the zone (the instant is the moment
    the clock jumps), ``"fold"`` when the wall time occurs twice (the instant is the first
    occurrence), else ``None``.
    """

    instant: datetime
    wall: datetime | None
    note: Note = None
    #: Of a union (``schedule.specs``): the indexes of the specs that produced this instant.
    specs: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Window:
    """Optional validity window: no instant before ``not_before`` or after ``not_after``."""

    not_before: datetime | None = None
    not_after: datetime | None = None


@dataclass(frozen=True, slots=True)
class CronRecurrence:
    """A cron expression evaluated on wall time in ``zone``."""

    expression: str
    zone_name: str
    window: Window
    zone: ZoneInfo = field(repr=False, compare=False)
    matcher: WallMatcher = field(repr=False, compare=False)
    calendars: tuple[str, ...] = ()
    kind: Literal["cron"] = "cron"

    def spec(self) -> dict[str, Any]:
        return _with_window({"cron": self.expression, "zone": self.zone_name}, self.window, self.calendars)


@dataclass(frozen=True, slots=True)
class IntervalRecurrence:
    """Every ``every`` from ``anchor``: instants ``anchor + k * every`` for k = 0, 1, 2, …"""

    every: timedelta
    anchor: datetime
    zone_name: str
    window: Window
    calendars: tuple[str, ...] = ()
    kind: Literal["interval"] = "interval"

    def spec(self) -> dict[str, Any]:
        return _with_window(
            {"every": format_duration(self.every), "anchor": format_instant(self.anchor),
             "zone": self.zone_name},
            self.window, self.calendars,
        )


@dataclass(frozen=True, slots=True)
class OneShotRecurrence:
    """A single instant."""

    at: datetime
    zone_name: str
    window: Window
    calendars: tuple[str, ...] = ()
    kind: Literal["once"] = "once"

    def spec(self) -> dict[str, Any]:
        return _with_window({"at": format_instant(self.at), "zone": self.zone_name}, self.window, self.calendars)


@dataclass(frozen=True, slots=True)
class UnionRecurrence:
    """Several specs (decision 0155): the union of ``members`` (in ``specs`` order), bounded by
    ``window``. Its next instant is the minimum of its members' (each with its own zone, DST rules and
    window); an instant two members share is one instant (:func:`next_occurrence` names them)."""

    members: tuple[SingleRecurrence, ...]
    window: Window
    calendars: tuple[str, ...] = ()
    kind: Literal["union"] = "union"

    @property
    def zone_name(self) -> str:
        """The first member's zone."""
        return self.members[0].zone_name

    def spec(self) -> dict[str, Any]:
        return _with_window({"specs": [m.spec() for m in self.members]}, self.window, self.calendars)


#: One spec: what a single-spec schedule compiles to, and each member of a union.
SingleRecurrence = CronRecurrence | IntervalRecurrence | OneShotRecurrence
Recurrence = CronRecurrence | IntervalRecurrence | OneShotRecurrence | UnionRecurrence


def _with_window(d: dict[str, Any], w: Window, calendars: tuple[str, ...] = ()) -> dict[str, Any]:
    if w.not_before is not None:
        d["not_before"] = format_instant(w.not_before)
    if w.not_after is not None:
        d["not_after"] = format_instant(w.not_after)
    if calendars:
        d["calendars"] = list(calendars)
    return d


# ----------------------------------------------------------------------------------------------
# Compilation


def _window(not_before: datetime | str | None, not_after: datetime | str | None) -> Window:
    nb = _as_instant(not_before, "not_before")
    na = _as_instant(not_after, "not_after")
    if nb is not None and na is not None and na < nb:
        raise RecurrenceError("not_after", "is before not_before")
    return Window(nb, na)


def _as_instant(value: datetime | str | None, name: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise RecurrenceError(name, "must carry a UTC offset")
        return value.astimezone(UTC)
    return parse_instant(value, name)


def compile_cron(expression: str, zone: str = "UTC", *, not_before: datetime | str | None = None,
                 not_after: datetime | str | None = None) -> CronRecurrence:
    """Compile a cron expression in an IANA zone (see :mod:`fireledger.recurrence.cron`)."""
    tz = load_zone(zone)
    matcher = WallMatcher(expression)
    return CronRecurrence(matcher.expression, zone, _window(not_before, not_after), tz, matcher)


def compile_interval(every: timedelta | str, anchor: datetime | str, zone: str = "UTC", *,
                     not_before: datetime | str | None = None,
                     not_after: datetime | str | None = None) -> IntervalRecurrence:
    """Compile a fixed interval from ``anchor`` (an absolute duration; wall time plays no part)."""
    load_zone(zone)
    if isinstance(every, str):
        period = parse_duration(every, "every", minimum=_MIN_INTERVAL, maximum=_MAX_INTERVAL)
    else:
        period = every
        if not _MIN_INTERVAL <= period <= _MAX_INTERVAL:
            raise RecurrenceError("every", "must be between 1s and 50 years")
    if period % _ONE_S:
        raise RecurrenceError("every", "must be a whole number of seconds")
    start = _as_instant(anchor, "anchor")
    assert start is not None
    return IntervalRecurrence(period, start, zone, _window(not_before, not_after))


def compile_once(at: datetime | str, zone: str = "UTC", *, not_before: datetime | str | None = None,
                 not_after: datetime | str | None = None) -> OneShotRecurrence:
    """Compile a one-shot recurrence at instant ``at``."""
    load_zone(zone)
    instant = _as_instant(at, "at")
    assert instant is not None
    return OneShotRecurrence(instant, zone, _window(not_before, not_after))


_SPEC_KEYS = {"cron", "every", "at", "zone", "anchor", "not_before", "not_after", "calendars"}
_UNION_KEYS = {"specs", "not_before", "not_after", "calendars"}
_MEMBER_KEYS = _SPEC_KEYS - {"calendars"}
#: The most exclusion calendars one schedule may name.
MAX_CALENDARS = 8


def compile_spec(spec: Mapping[str, Any], *, default_anchor: datetime | None = None) -> Recurrence:
    """Compile a schedule as the API takes it: ``{"cron": …, "zone": …}``, ``{"every": "90s"}`` or
    ``{"at": RFC3339}``, each with optional ``not_before`` / ``not_after`` — or several of them as
    ``{"specs": [...], "not_before"?, "not_after"?}`` (a :class:`UnionRecurrence`, decision 0155).
    Either form may name exclusion ``calendars`` (names only: checked and applied by the planes).

    An interval without ``anchor`` is anchored at ``default_anchor`` (the trigger's start).
    Field names in errors are prefixed ``schedule.`` (a member's ``schedule.specs[i].``).
    """
    if not isinstance(spec, Mapping):
        raise RecurrenceError("schedule", "must be an object with one of cron, every, at, specs")
    if "specs" in spec:
        return _compile_union(spec, default_anchor)
    rec = _compile_single(spec, default_anchor, _SPEC_KEYS)
    cals = _calendar_names(spec.get("calendars"))
    return replace(rec, calendars=cals) if cals else rec


def _compile_single(spec: Mapping[str, Any], default_anchor: datetime | None,
                    keys: set[str]) -> SingleRecurrence:
    unknown = set(spec) - keys
    if unknown:
        raise RecurrenceError(f"schedule.{sorted(unknown)[0]}", "is not a schedule field")
    forms = [k for k in ("cron", "every", "at") if k in spec]
    if len(forms) != 1:
        raise RecurrenceError("schedule", "must have exactly one of cron, every, at")
    zone = spec.get("zone", "UTC")
    try:
        if forms[0] == "cron":
            return compile_cron(spec["cron"], zone, not_before=spec.get("not_before"),
                                not_after=spec.get("not_after"))
        if forms[0] == "every":
            anchor = spec.get("anchor", default_anchor)
            if anchor is None:
                raise RecurrenceError("anchor", "is required for an interval")
            return compile_interval(spec["every"], anchor, zone, not_before=spec.get("not_before"),
                                    not_after=spec.get("not_after"))
        return compile_once(spec["at"], zone, not_before=spec.get("not_before"),
                            not_after=spec.get("not_after"))
    except NoMatchError as exc:
        raise NoMatchError(f"schedule.{exc.field}", exc.problem) from None
    except RecurrenceError as exc:
        raise RecurrenceError(f"schedule.{exc.field}", exc.problem) from None


def _compile_union(spec: Mapping[str, Any], default_anchor: datetime | None) -> UnionRecurrence:
    unknown = set(spec) - _UNION_KEYS
    if unknown:
        raise RecurrenceError(f"schedule.{sorted(unknown)[0]}",
                              "is not a field of a schedule with specs (each spec carries its own cron, every "
                              "or at, and zone)")
    items = spec["specs"]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_SPECS:
        raise RecurrenceError("schedule.specs", f"must be a list of 1 to {MAX_SPECS} specs")
    members: list[SingleRecurrence] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise RecurrenceError(f"schedule.specs[{i}]", "must be an object with one of cron, every, at")
        try:
            members.append(_compile_single(item, default_anchor, _MEMBER_KEYS))
        except RecurrenceError as exc:
            cls = NoMatchError if isinstance(exc, NoMatchError) else RecurrenceError
            field_name, problem = member_field(i, exc)
            raise cls(field_name, problem) from None
    try:
        window = _window(spec.get("not_before"), spec.get("not_after"))
    except RecurrenceError as exc:
        raise RecurrenceError(f"schedule.{exc.field}", exc.problem) from None
    return UnionRecurrence(tuple(members), window, _calendar_names(spec.get("calendars")))


def _calendar_names(value: Any) -> tuple[str, ...]:
    """The exclusion calendars a schedule names (checked for form only: that they exist is the
    registry's check)."""
    from .calendar import name_problem

    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_CALENDARS:
        raise RecurrenceError("schedule.calendars", f"must be a list of at most {MAX_CALENDARS} calendar names")
    for i, name in enumerate(value):
        problem = name_problem(name)
        if problem:
            raise RecurrenceError(f"schedule.calendars[{i}]", problem)
        if name in value[:i]:
            raise RecurrenceError(f"schedule.calendars[{i}]", f"{name!r} is named twice")
    return tuple(value)


# ----------------------------------------------------------------------------------------------
# Evaluation


def _utc_naive(dt: datetime) -> datetime:
    return dt.astimezone(UTC).replace(tzinfo=None)


def _transition(zone: ZoneInfo, lo: datetime, hi: datetime, after_offset: timedelta) -> datetime:
    """The UTC instant (naive) in ``(lo, hi]`` at which the zone's offset becomes ``after_offset``.

    ``lo`` must have the old offset and ``hi`` the new one. Binary search to the second (tzdata
    transitions fall on whole seconds); at most ~17 steps for a one-day window.
    """
    lo_s = int((lo - _EPOCH) // _ONE_S)
    hi_s = -int(-(hi - _EPOCH) // _ONE_S)
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if datetime.fromtimestamp(mid, zone).utcoffset() == after_offset:
            hi_s = mid
        else:
            lo_s = mid
    return _EPOCH + timedelta(seconds=hi_s)


def _resolve(zone: ZoneInfo, wall: datetime) -> tuple[datetime, Note]:
    """Map a naive wall time to a naive UTC instant under the declared DST rules."""
    off0 = zone.utcoffset(wall.replace(tzinfo=zone, fold=0))
    off1 = zone.utcoffset(wall.replace(tzinfo=zone, fold=1))
    assert off0 is not None and off1 is not None
    u0 = wall - off0
    if off0 == off1:
        return u0, None
    u1 = wall - off1
    if u0 < u1:
        # Occurs twice (fold): the first occurrence, under the earlier (larger) offset.
        return u0, "fold"
    # Does not exist (gap): the instant the clock jumps, somewhere in (u1, u0].
    return _transition(zone, u1, u0, off1), "gap"


def _fold_end_wall(zone: ZoneInfo, after_utc: datetime, local: datetime) -> datetime:
    """For an instant in the *second* pass of a fold, the last wall time of the repeated period.

    Every wall time up to it resolves (first occurrence) to before ``after_utc``.
    """
    off_now = local.utcoffset()
    off_before = zone.utcoffset(local.replace(fold=0))
    assert off_now is not None and off_before is not None
    # The transition lies in (after - (off_before - off_now), after]; find it.
    lo = after_utc - (off_before - off_now) - _ONE_S
    t = _transition(zone, lo, after_utc, off_now)
    # Wall times in the overlap are [t + off_now, t + off_before); return the last second of it.
    return t + off_before - _ONE_US


def _next_cron(rec: CronRecurrence, after: datetime) -> tuple[datetime, datetime, Note] | None:
    """First (utc instant, wall, note) strictly after aware ``after``, unbounded by the window; None
    once the last year the expression names is over."""
    zone = rec.zone
    try:
        after_utc = _utc_naive(after)
        local = after.astimezone(zone)
        wall = local.replace(tzinfo=None)
        if local.fold:
            wall = _fold_end_wall(zone, after_utc, local)
        for _ in range(_MAX_CANDIDATES):
            found = rec.matcher.next_wall(wall)
            if found is None:
                return None
            wall = found
            instant, note = _resolve(zone, wall)
            if instant > after_utc:
                return instant, wall, note
    except OverflowError:
        # ``after`` within a day of 0001-01-01 or 9999-12-31: no representable instant.
        raise NoMatchError("cron", f"no instant of {rec.expression!r} after {after.isoformat()} "
                           "within the years 0001-9999") from None
    raise NoMatchError("cron", f"search for {rec.expression!r} after {format_instant(after)} did not settle")


def next_occurrence(rec: Recurrence, after: datetime) -> Occurrence | None:
    """The first occurrence strictly after ``after`` (aware), or ``None`` when exhausted.

    Pure: no clock, no I/O. Raises :class:`NoMatchError` when a cron search is exhausted.
    """
    if isinstance(rec, UnionRecurrence):
        return _union_next(rec, after)
    w = rec.window
    if w.not_before is not None and after < w.not_before:
        after = w.not_before - _ONE_US
    if isinstance(rec, CronRecurrence):
        found = _next_cron(rec, after)
        if found is None:
            return None
        inst, wall, note = found
        instant = inst.replace(tzinfo=UTC)
        occ = Occurrence(instant, wall.replace(tzinfo=rec.zone, fold=0) if note != "gap" else wall, note)
    elif isinstance(rec, IntervalRecurrence):
        if after < rec.anchor:
            instant = rec.anchor
        else:
            k = (after - rec.anchor) // rec.every + 1
            try:
                instant = rec.anchor + k * rec.every
            except OverflowError:
                return None  # the next instant is past 9999-12-31: nothing left to fire
        occ = Occurrence(instant, None, None)
    else:
        if rec.at <= after:
            return None
        occ = Occurrence(rec.at, None, None)
    if w.not_after is not None and occ.instant > w.not_after:
        return None
    return occ


def _union_next(rec: UnionRecurrence, after: datetime) -> Occurrence | None:
    """A union's first occurrence after ``after``: its ``specs`` the members on it, its wall time and
    note the first of them's. A member's ``NoMatchError`` names ``specs[i].<field>``."""
    w = rec.window
    if w.not_before is not None and after < w.not_before:
        after = w.not_before - _ONE_US
    found: list[Occurrence | None] = []
    for i, m in enumerate(rec.members):
        try:
            found.append(next_occurrence(m, after))
        except RecurrenceError as exc:
            raise renamed(i, exc) from None
    idx = earliest([None if o is None else o.instant for o in found])
    best = found[idx[0]] if idx else None
    if best is None or (w.not_after is not None and best.instant > w.not_after):
        return None
    return replace(best, specs=idx)


def next_after(rec: Recurrence, after: datetime) -> datetime | None:
    """The first instant strictly after ``after``, or ``None`` when the recurrence is exhausted.

    The timing loop and preview both call this; it is the only definition of "when is it due". Of a
    union: the minimum of its members' next instants (decision 0155).
    """
    if isinstance(rec, UnionRecurrence):
        occ = _union_next(rec, after)
        return None if occ is None else occ.instant
    w = rec.window
    if isinstance(rec, CronRecurrence):
        if w.not_before is not None and after < w.not_before:
            after = w.not_before - _ONE_US
        found = _next_cron(rec, after)
        if found is None:
            return None
        inst = found[0].replace(tzinfo=UTC)
        if w.not_after is not None and inst > w.not_after:
            return None
        return inst
    occ = next_occurrence(rec, after)
    return None if occ is None else occ.instant


def iter_occurrences(rec: Recurrence, after: datetime) -> Iterator[Occurrence]:
    """Occurrences strictly after ``after``, in order, until the recurrence is exhausted."""
    while True:
        occ = next_occurrence(rec, after)
        if occ is None:
            return
        yield occ
        after = occ.instant


def preview(rec: Recurrence, after: datetime, count: int) -> list[Occurrence]:
    """The next ``count`` occurrences after ``after`` (fewer when the recurrence ends)."""
    out: list[Occurrence] = []
    if count <= 0:
        return out
    for occ in iter_occurrences(rec, after):
        out.append(occ)
        if len(out) >= count:
            break
    return out
