"""Property tests for the Quartz additions to cron: ``nW``, ``?`` and the year field (decision 0143).

Checked against a reference written here, independently of ``fireledger.recurrence``:

* :func:`ref_nearest_weekday` — "the Mon-Fri day of the month closest to day n" by brute force over
  the month's days (no Saturday/Sunday case analysis);
* :class:`RefQuartz` — a naive date/time matcher for the expressions the strategy draws;
* the declared DST rules via ``first_instant`` of the main property module (a wall time fires at
  the first instant whose local wall time reaches it: the jump in a gap, the first pass in a fold).
"""

from __future__ import annotations

import calendar
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from fireledger.recurrence import NoMatchError, compile_cron, next_after, next_occurrence
from test_recurrence_properties import ZONES, first_instant, local_wall, transitions

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ref_nearest_weekday(year: int, month: int, n: int) -> int | None:
    last = calendar.monthrange(year, month)[1]
    if n > last:
        return None
    weekdays = [d for d in range(1, last + 1) if date(year, month, d).weekday() < 5]
    return min(weekdays, key=lambda d: abs(d - n))


@dataclass(frozen=True)
class RefQuartz:
    """The expression the strategy draws, kept as plain sets: nothing shared with the code under test."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    dom_days: frozenset[int]          # plain day numbers
    dom_w: frozenset[int]             # n of each nW term
    dom_free: bool                    # day-of-month is * or ?
    months: frozenset[int]
    dows: frozenset[int] | None       # None: * or ?  (0 = Sunday)
    years: frozenset[int] | None
    text: str

    def match_date(self, d: date) -> bool:
        if d.month not in self.months or (self.years is not None and d.year not in self.years):
            return False
        dom = self.dom_free or d.day in self.dom_days or any(
            ref_nearest_weekday(d.year, d.month, n) == d.day for n in self.dom_w)
        dow = self.dows is None or (d.weekday() + 1) % 7 in self.dows
        if not self.dom_free and self.dows is not None:
            return dom or dow
        return dom and dow

    def walls_from(self, start: datetime, end_year: int) -> Iterator[datetime]:
        day = start.date()
        while day.year < end_year:
            if self.match_date(day):
                for h in self.hours:
                    for m in self.minutes:
                        for s in self.seconds:
                            w = datetime.combine(day, time(h, m, s))
                            if w >= start:
                                yield w
            day += timedelta(days=1)


def _values(lo: int, hi: int, most: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(lo, hi), min_size=1, max_size=most, unique=True).map(lambda v: tuple(sorted(v)))


def _list_text(values: tuple[int, ...] | frozenset[int]) -> str:
    return ",".join(str(v) for v in sorted(values))


@st.composite
def quartz_exprs(draw: st.DrawFn) -> RefQuartz:
    seconds = draw(_values(0, 59, 2))
    minutes = draw(st.sampled_from([(0,), (30,), (0, 30), (15, 45), (59,)]))
    hours = draw(st.one_of(_values(0, 23, 3), st.sampled_from([(0, 1, 2, 3), (1, 2), (23,)])))
    w = frozenset(draw(st.lists(st.integers(1, 31), min_size=0, max_size=2)))
    plain = frozenset(draw(st.lists(st.integers(1, 28), min_size=0, max_size=2)))
    dom_free = not w and not plain
    if dom_free:
        dom_text = draw(st.sampled_from(["*", "?"]))
        dows = draw(st.one_of(st.none(), st.frozensets(st.integers(0, 6), min_size=1, max_size=3)))
    else:
        dom_text = ",".join([f"{n}W" for n in sorted(w)] + [str(n) for n in sorted(plain)])
        dows = draw(st.one_of(st.none(), st.none(), st.frozensets(st.integers(0, 6), min_size=1, max_size=2)))
    dow_text = ("?" if dom_text != "?" else "*") if dows is None else _list_text(dows)
    if dows is None and dom_text == "*":
        dow_text = draw(st.sampled_from(["*", "?"]))
    months = frozenset(draw(st.one_of(st.just(tuple(range(1, 13))), _values(1, 12, 4))))
    year_form = draw(st.sampled_from(["none", "*", "list", "range", "step"]))
    years: frozenset[int] | None = None
    year_text = ""
    if year_form == "*":
        year_text = " *"
    elif year_form == "list":
        years = frozenset(draw(st.lists(st.integers(2024, 2040), min_size=1, max_size=4)))
        year_text = " " + _list_text(years)
    elif year_form == "range":
        a = draw(st.integers(2024, 2036))
        b = draw(st.integers(a, a + 5))
        years, year_text = frozenset(range(a, b + 1)), f" {a}-{b}"
    elif year_form == "step":
        a, k = draw(st.integers(2024, 2030)), draw(st.integers(1, 7))
        years, year_text = frozenset(range(a, 2200, k)), f" {a}/{k}"
    text = (f"{_list_text(seconds)} {_list_text(minutes)} {_list_text(hours)} {dom_text} "
            f"{_list_text(months)} {dow_text}{year_text}")
    return RefQuartz(seconds, minutes, hours, plain, w, dom_free, months, dows, years, text)


AFTER = st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2036, 12, 31),
                     timezones=st.just(UTC))


def compiled_or_reject(ref: RefQuartz, zone: str) -> object:
    try:
        return compile_cron(ref.text, zone)
    except NoMatchError:
        # Only when no listed year/month has the day: check that claim against the reference.
        start = datetime(1970, 1, 1)
        assert next(iter(ref.walls_from(start, 2200)), None) is None
        reject()


def reference_next(ref: RefQuartz, zone: str, after: datetime) -> datetime | None:
    start = local_wall(zone, after).replace(microsecond=0)
    end_year = (max(ref.years) + 1) if ref.years is not None else start.year + 12
    for wall in ref.walls_from(start, end_year):
        instant, _ = first_instant(zone, wall)
        if instant > after:
            return instant
    return None


@PROPS
@given(ref=quartz_exprs(), zone=st.sampled_from(ZONES), after=AFTER)
def test_chained_results_are_increasing_and_agree_with_the_reference(ref: RefQuartz, zone: str,
                                                                    after: datetime) -> None:
    rec = compiled_or_reject(ref, zone)
    event("years named" if ref.years is not None else "any year")
    event("W" if ref.dom_w else "no W")
    t = after
    for _ in range(4):
        got = next_after(rec, t)  # type: ignore[arg-type]
        want = reference_next(ref, zone, t)
        if want is None and got is not None:
            # The reference looks 12 years ahead when no year is named; the compiler 50.
            assert ref.years is None and got.year >= t.year + 11
            return
        assert got == want, ref.text
        if got is None:
            return
        assert got > t
        t = got


@st.composite
def near_a_transition(draw: st.DrawFn) -> tuple[str, datetime]:
    zone = draw(st.sampled_from([z for z in ZONES if transitions(z)]))
    t = draw(st.sampled_from([t for t, _, _ in transitions(zone) if 2024 <= t.year <= 2036]))
    return zone, t - timedelta(seconds=draw(st.integers(0, 3 * 86400)))


@PROPS
@given(ref=quartz_exprs(), za=near_a_transition())
def test_across_dst_transitions_the_declared_rules_hold(ref: RefQuartz, za: tuple[str, datetime]) -> None:
    zone, after = za
    rec = compiled_or_reject(ref, zone)
    got, want = next_after(rec, after), reference_next(ref, zone, after)  # type: ignore[arg-type]
    if want is None and got is not None:
        assert ref.years is None and got.year >= after.year + 11
        return
    assert got == want, ref.text


@PROPS
@given(ref=quartz_exprs(), zone=st.sampled_from(ZONES), after=AFTER)
def test_wall_times_respect_w_and_the_year(ref: RefQuartz, zone: str, after: datetime) -> None:
    rec = compiled_or_reject(ref, zone)
    occ = next_occurrence(rec, after)  # type: ignore[arg-type]
    if occ is None:
        assert ref.years is not None and max(ref.years) <= local_wall(zone, after).year
        return
    assert occ.wall is not None
    wall = occ.wall.replace(tzinfo=None)
    if ref.years is not None:
        assert wall.year in ref.years
    if ref.dom_w and not ref.dom_days and ref.dows is None:
        # Only W terms: a weekday of the same month, at most two days from one of the named days.
        assert wall.weekday() < 5
        assert any(abs(wall.day - n) <= 2 for n in ref.dom_w)
        assert any(ref_nearest_weekday(wall.year, wall.month, n) == wall.day for n in ref.dom_w)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 31), year=st.integers(1970, 2199), month=st.integers(1, 12))
def test_w_never_leaves_the_month(n: int, year: int, month: int) -> None:
    want = ref_nearest_weekday(year, month, n)
    try:
        rec = compile_cron(f"0 0 0 {n}W {month} ? {year}", "UTC")
    except NoMatchError:
        assert want is None   # the month has no day n in that year: nothing to fire, ever
        return
    got = next_after(rec, datetime(year, 1, 1, tzinfo=UTC) - timedelta(seconds=1))
    assert want is not None and got == datetime(year, month, want, tzinfo=UTC)


@settings(max_examples=40, deadline=None)
@given(years=st.lists(st.sampled_from([y for y in range(1970, 2200) if not calendar.isleap(y)]),
                      min_size=1, max_size=5))
def test_a_day_no_named_year_has_raises_the_distinct_error(years: list[int]) -> None:
    with pytest.raises(NoMatchError) as info:
        compile_cron(f"0 0 0 29 2 ? {','.join(map(str, sorted(set(years))))}", "Europe/London")
    assert info.value.field == "cron" and "never matches" in info.value.problem


def test_years_past_the_last_end_the_recurrence_not_an_error() -> None:
    rec = compile_cron("0 0 9 1 1 ? 2024-2026", "Europe/London")
    assert next_after(rec, datetime(2026, 1, 1, 9, tzinfo=UTC)) is None
    assert next_after(rec, datetime(2025, 6, 1, tzinfo=UTC)) == datetime(2026, 1, 1, 9, tzinfo=UTC)
    assert rec.expression == "0 0 9 1 1 ? 2024-2026"
