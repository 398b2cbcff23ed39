"""Property tests for the recurrence compiler (DESIGN.md §2 invariant 6, §4 preview contract).

Everything the compiler returns is checked against references written here, independently of
``fireledger.recurrence``:

* :class:`NaiveCron` — a plain field-set matcher on naive wall time (lists, ranges, steps, names,
  ``L``, ``LW``, ``nL``, ``n#k``, Vixie OR of day-of-month and day-of-week);
* :func:`reference_next` — the declared DST rules stated directly: a wall time ``w`` fires at the
  first instant whose local wall time reaches ``w`` (first occurrence in a fold, the jump instant in
  a gap); the answer is the smallest such instant after ``after``;
* :func:`high_water_scan` — brute force: walk UTC instants one step at a time and fire whenever the
  wall clock passes a matching wall time it has not passed before;
* cronsim (naive datetimes only) for the bisect-based wall-time search.

Zones for the references are read from the pinned ``tzdata`` package directly (never the host).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from functools import cache
from importlib import resources
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from fireledger.recurrence import (
    CronRecurrence,
    NoMatchError,
    compile_cron,
    compile_interval,
    compile_once,
    compile_spec,
    load_zone,
    next_after,
    next_occurrence,
    preview,
)
from fireledger.recurrence.cron import WallMatcher

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ZONES = [
    "Europe/London",
    "America/New_York",
    "Australia/Sydney",
    "Australia/Lord_Howe",  # 30-minute shift
    "UTC",
    "Asia/Kolkata",  # +05:30, no DST
    "America/St_Johns",  # -03:30 / -02:30
    "Pacific/Chatham",  # +12:45 / +13:45
    "Europe/Dublin",  # "negative DST" in tzdata (IST standard, GMT in winter)
    "Africa/Casablanca",  # +01 with a Ramadan fall-back to +00
    "America/Havana",  # transitions at midnight: whole days lose 00:xx
    "Antarctica/Troll",  # +00 / +02: a two-hour gap and fold
]

ONE_S = timedelta(seconds=1)
ONE_US = timedelta(microseconds=1)


# ----------------------------------------------------------------------------------------------
# Zone data, straight from the pinned package


@cache
def tz(name: str) -> ZoneInfo:
    res = resources.files("tzdata.zoneinfo")
    for part in name.split("/"):
        res = res.joinpath(part)
    with res.open("rb") as fh:
        return ZoneInfo.from_file(fh, key=name)


def offset_at(name: str, instant: datetime) -> timedelta:
    off = instant.astimezone(tz(name)).utcoffset()
    assert off is not None
    return off


@cache
def transitions(name: str) -> tuple[tuple[datetime, timedelta, timedelta], ...]:
    """(instant, offset before, offset after) for every offset change 2018-2046 (daily scan + bisect)."""
    out = []
    t = datetime(2018, 1, 1, tzinfo=UTC)
    prev = offset_at(name, t)
    while t.year < 2046:
        t2 = t + timedelta(days=1)
        cur = offset_at(name, t2)
        if cur != prev:
            lo, hi = t, t2
            while hi - lo > ONE_S:
                mid = lo + (hi - lo) / 2
                mid = mid.replace(microsecond=0)
                if offset_at(name, mid) == prev:
                    lo = mid
                else:
                    hi = mid
            out.append((hi, prev, cur))
        prev, t = cur, t2
    return tuple(out)


def local_wall(name: str, instant: datetime) -> datetime:
    return instant.astimezone(tz(name)).replace(tzinfo=None)


def first_instant(name: str, wall: datetime) -> tuple[datetime, str | None]:
    """The instant wall time ``wall`` fires at under the declared rules, and its note."""
    zone = tz(name)
    seen = []
    for fold in (0, 1):
        u = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
        if u.astimezone(zone).replace(tzinfo=None) == wall:
            seen.append(u)
    if seen:
        return min(seen), ("fold" if len(set(seen)) == 2 else None)
    for t, before, after in transitions(name):
        start = t.replace(tzinfo=None) + before
        if start <= wall < t.replace(tzinfo=None) + after:
            return t, "gap"
    raise AssertionError(f"{wall} does not exist in {name} but no transition covers it")


# ----------------------------------------------------------------------------------------------
# An independent naive cron matcher

MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
RANGES = [(0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


def _num(i: int, tok: str) -> int:
    if i == 4 and tok in MONTHS:
        return MONTHS.index(tok) + 1
    if i == 5 and tok in DAYS:
        return DAYS.index(tok)
    return int(tok)


class NaiveCron:
    """Field sets and a date predicate; nothing shared with the code under test."""

    def __init__(self, expr: str) -> None:
        parts = expr.upper().split()
        if len(parts) == 5:
            parts.insert(0, "0")
        self.values: list[set[int]] = []
        self.special: list[set[object]] = []
        for i, text in enumerate(parts):
            lo, hi = RANGES[i]
            vals: set[int] = set()
            special: set[object] = set()
            for term in text.split(","):
                base, _, step_text = term.partition("/")
                step = int(step_text) if step_text else 1
                if base == "*":
                    a, b = lo, hi
                elif i == 3 and base in ("L", "LW"):
                    special.add(base)
                    continue
                elif i == 5 and base.endswith("L"):
                    special.add(("L", _num(i, base[:-1]) % 7))
                    continue
                elif i == 5 and "#" in base:
                    d, _, k = base.partition("#")
                    special.add(("#", _num(i, d) % 7, int(k)))
                    continue
                elif "-" in base:
                    x, _, y = base.partition("-")
                    a, b = _num(i, x), _num(i, y)
                else:
                    a = _num(i, base)
                    b = hi if step_text else a
                vals.update(range(a, b + 1, step))
            if i == 5:
                vals = {v % 7 for v in vals}
            self.values.append(vals)
            self.special.append(special)
        self.day_or = not (parts[3].startswith("*") or parts[5].startswith("*"))
        self.seconds, self.minutes, self.hours = (sorted(v) for v in self.values[:3])

    def _dom(self, d: date) -> bool:
        last = calendar.monthrange(d.year, d.month)[1]
        if d.day in self.values[3]:
            return True
        if "L" in self.special[3] and d.day == last:
            return True
        if "LW" in self.special[3]:
            lw = last
            while date(d.year, d.month, lw).weekday() >= 5:
                lw -= 1
            if d.day == lw:
                return True
        return False

    def _dow(self, d: date) -> bool:
        w = (d.weekday() + 1) % 7  # Sunday = 0
        last = calendar.monthrange(d.year, d.month)[1]
        if w in self.values[5]:
            return True
        for s in self.special[5]:
            assert isinstance(s, tuple)
            if s[0] == "L" and s[1] == w and d.day + 7 > last:
                return True
            if s[0] == "#" and s[1] == w and (d.day - 1) // 7 + 1 == s[2]:
                return True
        return False

    def match_date(self, d: date) -> bool:
        if d.month not in self.values[4]:
            return False
        dom, dow = self._dom(d), self._dow(d)
        return (dom or dow) if self.day_or else (dom and dow)

    def match(self, w: datetime) -> bool:
        return (
            w.second in self.values[0]
            and w.minute in self.values[1]
            and w.hour in self.values[2]
            and self.match_date(w.date())
        )

    def walls_from(self, start: datetime, years: int = 60) -> Iterator[datetime]:
        """Matching naive wall times >= ``start`` (whole seconds), in order."""
        day = start.date()
        end = date(min(day.year + years, 9999), 1, 1)
        first = True
        while day < end:
            if self.match_date(day):
                for h in self.hours:
                    if first and h < start.hour:
                        continue
                    for m in self.minutes:
                        if first and (h, m) < (start.hour, start.minute):
                            continue
                        for s in self.seconds:
                            w = datetime.combine(day, time(h, m, s))
                            if w >= start:
                                yield w
            first = False
            day += timedelta(days=1)


def reference_next(expr: str, name: str, after: datetime, budget: int = 200_000) -> datetime:
    """Smallest first-reach instant > ``after`` over all matching wall times (the declared rules)."""
    naive = NaiveCron(expr)
    # Every wall time up to the one shown at ``after`` has been reached by ``after``, so start there
    # (inside the second pass of a fold the walls just above it were reached too, and are skipped).
    start = local_wall(name, after).replace(microsecond=0)
    for n, wall in enumerate(naive.walls_from(start)):
        instant, _ = first_instant(name, wall)
        if instant > after:
            return instant
        assert n < budget, "reference search ran too long"
    raise AssertionError("no match within 60 years")


def high_water_scan(expr: str, name: str, after: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """Brute force: instants in (after, end] on a ``step`` grid at which the wall clock passes a
    matching wall time it has never shown before."""
    naive = NaiveCron(expr)
    lead = timedelta(hours=3)  # long enough to see the top of any fold we might start inside
    u = datetime.fromtimestamp((after - lead).timestamp() // step.total_seconds() * step.total_seconds(), UTC)
    high = local_wall(name, u)
    out = []
    while u < end:
        u += step
        wall = local_wall(name, u)
        if wall > high:
            w = high + step
            while w <= wall:
                if naive.match(w):
                    if after < u <= end:
                        out.append(u)
                    break
                w += step
            high = wall
    return out


# ----------------------------------------------------------------------------------------------
# Strategies


def _term(lo: int, hi: int, values: st.SearchStrategy[int], names: list[str] | None = None) -> st.SearchStrategy[str]:
    def value_text(v: int) -> st.SearchStrategy[str]:
        if names is not None and 0 <= v - (lo if lo == 1 else 0) < len(names):
            return st.sampled_from([str(v), names[v - (lo if lo == 1 else 0)]])
        return st.just(str(v))

    single = values.flatmap(value_text)

    @st.composite
    def ranged(draw: st.DrawFn) -> str:
        a = draw(values)
        b = draw(st.integers(a, hi))
        text = f"{draw(value_text(a))}-{draw(value_text(b))}"
        if draw(st.booleans()):
            text += f"/{draw(st.integers(1, hi))}"
        return text

    stepped = st.tuples(st.sampled_from(["*"]) | values.map(str), st.integers(1, hi)).map(lambda p: f"{p[0]}/{p[1]}")
    return st.one_of(single, ranged(), stepped)


def _field(lo: int, hi: int, values: st.SearchStrategy[int], names: list[str] | None = None,
           extra: st.SearchStrategy[str] | None = None, star_weight: int = 1) -> st.SearchStrategy[str]:
    term = _term(lo, hi, values, names)
    if extra is not None:
        term = st.one_of(term, extra)
    listed = st.lists(term, min_size=1, max_size=3).map(",".join)
    return st.one_of(*([st.just("*")] * star_weight), listed)


SECONDS = st.one_of(
    st.sampled_from(["0", "30", "*/20", "0,30", "*/15", "10-15", "5-5/2", "*/7"]),
    _field(0, 59, st.integers(0, 59)),
)
MINUTES = _field(0, 59, st.one_of(st.sampled_from([0, 15, 30, 45]), st.integers(0, 59)))
HOURS = _field(0, 23, st.one_of(st.integers(0, 4), st.integers(0, 23)))  # DST hours are 0-4
DOM = _field(1, 31, st.integers(1, 31), extra=st.sampled_from(["L", "LW"]), star_weight=4)
MONTH = _field(1, 12, st.integers(1, 12), names=MONTHS, star_weight=4)
DOW_SPECIAL = st.one_of(
    st.tuples(st.integers(0, 7), st.integers(1, 5)).map(lambda p: f"{p[0]}#{p[1]}"),
    st.tuples(st.sampled_from(DAYS), st.integers(1, 5)).map(lambda p: f"{p[0]}#{p[1]}"),
)
DOW = st.one_of(
    _field(0, 7, st.integers(0, 7), names=DAYS, extra=DOW_SPECIAL, star_weight=4),
    st.integers(0, 7).map(lambda d: f"{d}L"),  # nL must stand alone
)


@st.composite
def any_cron_exprs(draw: st.DrawFn, six: bool | None = None) -> str:
    fields = [draw(MINUTES), draw(HOURS), draw(DOM), draw(MONTH), draw(DOW)]
    if six is None:
        six = draw(st.booleans())
    if six:
        fields.insert(0, draw(SECONDS))
    return " ".join(fields)


DST_HOURS = _field(0, 23, st.one_of(st.integers(0, 3), st.integers(0, 23)), star_weight=2)


@st.composite
def dst_cron_exprs(draw: st.DrawFn, six: bool | None = None) -> str:
    """Expressions that fire on the transition days, in the small hours where the clocks change."""
    date_fields = [draw(st.one_of(*[st.just("*")] * 5, DOM)), "*", draw(st.one_of(*[st.just("*")] * 5, DOW))]
    fields = [draw(MINUTES), draw(DST_HOURS), *date_fields]
    if six is None:
        six = draw(st.booleans())
    if six:
        fields.insert(0, draw(SECONDS))
    return " ".join(fields)


def cron_exprs(six: bool | None = None) -> st.SearchStrategy[str]:
    return st.one_of(any_cron_exprs(six), dst_cron_exprs(six))


AROUND = timedelta(hours=36)


@st.composite
def zone_and_after(draw: st.DrawFn) -> tuple[str, datetime]:
    """A zone and an ``after`` instant in 2020-2040; often close to (or exactly at) a transition."""
    name = draw(st.sampled_from(ZONES))
    trans = [t for t, _, _ in transitions(name) if t.year <= 2040]
    if trans and draw(st.integers(0, 3)) > 0:
        t = draw(st.sampled_from(trans))
        # Spread over scales, mostly just before the transition, so that dense expressions (every
        # second, every minute) and sparse ones (hourly, daily) both run into the gap or fold.
        seconds = st.one_of(
            st.sampled_from([0, -1, -1800, 1800, -3600, -5400, -7200]),
            st.integers(-10, 10),
            st.integers(-300, 10),
            st.integers(-7200, 600),
            st.integers(-int(AROUND.total_seconds()), int(AROUND.total_seconds())),
        )
        delta = draw(st.one_of(seconds.map(lambda s: timedelta(seconds=s)), st.sampled_from([ONE_US, -ONE_US])))
        after = t + delta
    else:
        after = draw(st.datetimes(datetime(2020, 1, 1), datetime(2040, 12, 31), timezones=st.just(UTC)))
    if draw(st.booleans()):
        after = after.replace(microsecond=draw(st.integers(0, 999_999)))
    return name, after


def compiled(expr: str, name: str) -> CronRecurrence:
    try:
        return compile_cron(expr, name)
    except NoMatchError:
        # Only legitimately empty expressions may be refused: day-of-month alone (AND) never fits.
        naive = NaiveCron(expr)
        assert not naive.day_or
        assert not any(naive.match_date(date(2000, 1, 1) + timedelta(days=d)) for d in range(366 * 8))
        assume(False)
        raise


# ----------------------------------------------------------------------------------------------
# Cron properties


@PROPS
@given(expr=cron_exprs(), za=zone_and_after())
def test_results_strictly_increasing_and_after(expr: str, za: tuple[str, datetime]) -> None:
    name, after = za
    rec = compiled(expr, name)
    got = [o.instant for o in preview(rec, after, 6)]
    assert len(got) == 6
    assert got[0] > after
    assert all(a < b for a, b in pairwise(got)), got
    assert all(g.tzinfo is not None and g.utcoffset() == timedelta(0) for g in got)


@PROPS
@given(expr=cron_exprs(), za=zone_and_after())
def test_each_result_matches_or_is_a_declared_gap_substitute(expr: str, za: tuple[str, datetime]) -> None:
    name, after = za
    rec = compiled(expr, name)
    naive = NaiveCron(expr)
    for occ in preview(rec, after, 6):
        event(f"note: {occ.note}")
        r = occ.instant
        wall = local_wall(name, r)
        if occ.note == "gap":
            # The instant the clock jumps, and some matching wall time lies in the jump.
            match = [(t, b, a) for t, b, a in transitions(name) if t == r]
            assert match, f"{r} is marked gap but is no transition of {name}"
            t, before, new = match[0]
            assert new > before
            gap_start, gap_end = t.replace(tzinfo=None) + before, t.replace(tzinfo=None) + new
            first = next(naive.walls_from(gap_start))
            assert gap_start <= first < gap_end, (first, gap_start, gap_end)
            assert occ.wall is not None and naive.match(occ.wall.replace(tzinfo=None))
            assert gap_start <= occ.wall.replace(tzinfo=None) < gap_end
            continue
        # Otherwise the wall time itself matches and this is its first occurrence.
        assert naive.match(wall), f"{r} shows {wall} in {name}, which {expr!r} does not match"
        assert first_instant(name, wall) == (r, occ.note), (r, occ.note, first_instant(name, wall))
        assert occ.wall is not None and occ.wall.replace(tzinfo=None) == wall


@PROPS
@given(expr=cron_exprs(), za=zone_and_after())
def test_agrees_with_reference_rules(expr: str, za: tuple[str, datetime]) -> None:
    """Completeness and exactness: each next instant is the smallest first-reach instant."""
    name, after = za
    rec = compiled(expr, name)
    t = after
    for _ in range(4):
        got = next_after(rec, t)
        assert got == reference_next(expr, name, t), (expr, name, t)
        assert got is not None
        t = got


@FEW
@given(expr=cron_exprs(six=False), za=zone_and_after())
def test_no_first_occurrence_skipped_minute_scan(expr: str, za: tuple[str, datetime]) -> None:
    """Brute force over a 6-hour window, minute by minute: exactly the same instants."""
    name, after = za
    rec = compiled(expr, name)
    end = after + timedelta(hours=6)
    expected = high_water_scan(expr, name, after, end, timedelta(minutes=1))
    got = []
    t = after
    while (nxt := next_after(rec, t)) is not None and nxt <= end:
        got.append(nxt)
        t = nxt
    assert got == expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=cron_exprs(six=True), za=zone_and_after())
def test_no_first_occurrence_skipped_second_scan(expr: str, za: tuple[str, datetime]) -> None:
    """Brute force over a 40-minute window, second by second (6-field expressions)."""
    name, after = za
    rec = compiled(expr, name)
    end = after + timedelta(minutes=40)
    expected = high_water_scan(expr, name, after, end, ONE_S)
    got = []
    t = after
    while (nxt := next_after(rec, t)) is not None and nxt <= end:
        got.append(nxt)
        t = nxt
    assert got == expected


DENSE = st.sampled_from([
    "* * * * *", "*/15 * * * *", "30 * * * *", "0 * * * *", "0,30 1-3 * * *", "*/20 30 1 * * *",
    "0 */30 * * * *", "45 2 * * *", "* 2 * * *", "30 2 * * *", "0 0 * * *", "59 59 * * * *",
])


@st.composite
def across_a_transition(draw: st.DrawFn) -> tuple[str, datetime, datetime]:
    """A zone, one of its transitions T, and an ``after`` up to three hours before T."""
    name = draw(st.sampled_from([z for z in ZONES if transitions(z)]))
    t = draw(st.sampled_from([t for t, _, _ in transitions(name) if t.year <= 2040]))
    back = draw(st.one_of(st.integers(0, 120), st.integers(0, 3 * 3600)))
    return name, t, t - timedelta(seconds=back) - draw(st.sampled_from([timedelta(0), ONE_US]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=st.one_of(DENSE, dst_cron_exprs()), zat=across_a_transition())
def test_chain_across_transitions_agrees_with_reference(expr: str, zat: tuple[str, datetime, datetime]) -> None:
    """Every instant from just before a transition to three hours after it (hourly, minutely, seconds)."""
    name, t, after = zat
    rec = compiled(expr, name)
    cur = after
    for _ in range(300):
        got = next_occurrence(rec, cur)
        assert got is not None
        assert got.instant == reference_next(expr, name, cur), (expr, name, cur)
        event(f"note: {got.note}")
        if got.instant > t + timedelta(hours=3):
            break
        cur = got.instant


@PROPS
@given(expr=cron_exprs(), za=zone_and_after(), n=st.integers(1, 8))
def test_preview_equals_iterated_next_after(expr: str, za: tuple[str, datetime], n: int) -> None:
    name, after = za
    rec = compiled(expr, name)
    chained = []
    t = after
    for _ in range(n):
        nxt = next_after(rec, t)
        assert nxt is not None
        occ = next_occurrence(rec, t)
        assert occ is not None and occ.instant == nxt
        chained.append(nxt)
        t = nxt
    assert [o.instant for o in preview(rec, after, n)] == chained


@FEW
@given(expr=cron_exprs(), za=zone_and_after())
def test_deterministic_across_compilations(expr: str, za: tuple[str, datetime]) -> None:
    name, after = za
    a = compiled(expr, name)
    b = compile_cron(expr, name)
    c = compile_spec(a.spec())
    d = compile_cron(a.expression, name)  # the normalised text compiles to the same recurrence
    runs = [preview(r, after, 5) for r in (a, b, c, d, a)]
    assert all(run == runs[0] for run in runs)


@FEW
@given(expr=cron_exprs(six=False), za=zone_and_after(), data=st.data())
def test_validity_window(expr: str, za: tuple[str, datetime], data: st.DataObject) -> None:
    name, after = za
    nb = after + timedelta(seconds=data.draw(st.integers(-86_400 * 3, 86_400 * 30)))
    na = nb + timedelta(seconds=data.draw(st.integers(0, 86_400 * 60)))
    plain = compiled(expr, name)
    rec = compile_cron(expr, name, not_before=nb, not_after=na)
    got = [o.instant for o in preview(rec, after, 5)]
    # Exactly the unbounded instants that fall inside [nb, na].
    expected = []
    t = max(after, nb - ONE_US)
    for _ in range(5):
        nxt = next_after(plain, t)
        assert nxt is not None
        if nxt > na:
            break
        expected.append(nxt)
        t = nxt
    assert got == expected
    assert all(nb <= g <= na for g in got)
    if len(got) < 5:
        assert next_after(rec, got[-1] if got else max(after, nb)) is None


# ----------------------------------------------------------------------------------------------
# The bisect time-of-day search against cronsim's stepping (naive wall time only)



def has_degenerate_range(expr: str) -> bool:
    """``a-a/n`` (also ``JAN-1/n``): cronsim reads it as ``a/n`` (a to the end of the field)."""
    parts = expr.upper().split()
    offset = 0 if len(parts) == 6 else 1
    for i, text in enumerate(parts):
        for term in text.split(","):
            m = re.fullmatch(r"([0-9A-Z]+)-([0-9A-Z]+)/\d+", term)
            if m and _num(i + offset, m.group(1)) == _num(i + offset, m.group(2)):
                return True
    return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    expr=any_cron_exprs(),
    wall=st.datetimes(datetime(2000, 1, 1), datetime(2040, 12, 31)),
)
def test_wall_matcher_agrees_with_cronsim(expr: str, wall: datetime) -> None:
    assume(not has_degenerate_range(expr))
    try:
        matcher = WallMatcher(expr)
    except NoMatchError:
        assume(False)
        raise
    try:
        expected = next(CronSim(expr, wall))
    except StopIteration:  # cronsim gives up after 50 years
        with pytest.raises(NoMatchError):
            matcher.next_wall(wall)
        return
    got = matcher.next_wall(wall)
    assert got == expected, (expr, wall)
    assert NaiveCron(expr).match(got)
    assert got == next(NaiveCron(expr).walls_from(wall.replace(microsecond=0) + ONE_S))


@pytest.mark.parametrize(
    ("expr", "minutes"),
    [
        pytest.param("5-5/2 * * * *", [5], id="minute-5-5/2"),
        pytest.param("10-10/15,40 * * * *", [10, 40], id="minute-10-10/15-in-list"),
        pytest.param("5/20 * * * *", [5, 25, 45], id="minute-5/20-to-end"),
        pytest.param("5-30/10 * * * *", [5, 15, 25], id="minute-5-30/10"),
    ],
)
def test_stepped_ranges(expr: str, minutes: list[int]) -> None:
    """``a-a/n`` is the single value a (cronsim alone would read it as a/n, to the end of the field)."""
    rec = compile_cron(expr, "UTC")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    got = [o.instant.minute for o in preview(rec, start - ONE_S, len(minutes) + 1)]
    assert got == [*minutes, minutes[0]]


def test_degenerate_weekday_range_with_step() -> None:
    rec = compile_cron("0 12 * * 3-3/2", "UTC")  # Wednesdays only (not Wed, Fri, Sun)
    got = [o.instant for o in preview(rec, datetime(2026, 1, 1, tzinfo=UTC), 3)]
    assert got == [datetime(2026, 1, 7, 12, tzinfo=UTC), datetime(2026, 1, 14, 12, tzinfo=UTC),
                   datetime(2026, 1, 21, 12, tzinfo=UTC)]


# ----------------------------------------------------------------------------------------------
# Day-of-month / day-of-week: OR when both restricted, AND otherwise (Vixie)


@pytest.mark.parametrize(
    ("expr", "month", "expected_days"),
    [
        # 2026-03: the 1st is a Sunday; Mondays are 2, 9, 16, 23, 30.
        pytest.param("0 0 13 3 MON", 3, [2, 9, 13, 16, 23, 30], id="both-restricted-OR"),
        pytest.param("0 0 13 3 *", 3, [13], id="dow-star-AND"),
        pytest.param("0 0 * 3 MON", 3, [2, 9, 16, 23, 30], id="dom-star-AND"),
        pytest.param("0 0 */2 3 MON", 3, [9, 23], id="dom-star-step-is-AND"),
        pytest.param("0 0 1-7 3 */3", 3, [1, 4, 7], id="dow-star-step-is-AND"),
        pytest.param("0 0 L 3 5L", 3, [27, 31], id="last-day-OR-last-friday"),
        pytest.param("0 0 LW 5 *", 5, [29], id="last-weekday-of-may"),  # 2026-05-31 is a Sunday
        pytest.param("0 0 * 3 1#2", 3, [9], id="second-monday"),
        pytest.param("0 0 * 3 SUN#5", 3, [29], id="fifth-sunday"),
        pytest.param("0 0 * 3 7", 3, [1, 8, 15, 22, 29], id="seven-is-sunday"),
    ],
)
def test_day_fields_combine_like_vixie_cron(expr: str, month: int, expected_days: list[int]) -> None:
    rec = compile_cron(expr, "UTC")
    got = [o.instant for o in preview(rec, datetime(2026, 1, 1, tzinfo=UTC), 40)]
    assert [g.day for g in got if (g.year, g.month) == (2026, month)] == expected_days


# ----------------------------------------------------------------------------------------------
# Intervals and one-shots

EPOCHS = st.datetimes(datetime(2020, 1, 1), datetime(2040, 12, 31), timezones=st.just(UTC))
PERIODS = st.one_of(st.integers(1, 120), st.integers(1, 86_400 * 40)).map(lambda s: timedelta(seconds=s))


@PROPS
@given(every=PERIODS, anchor=EPOCHS, after=EPOCHS, name=st.sampled_from(ZONES))
def test_interval_is_absolute(every: timedelta, anchor: datetime, after: datetime, name: str) -> None:
    rec = compile_interval(every, anchor, name)
    got = next_after(rec, after)
    assert got is not None and got > after
    assert (got - anchor) % every == timedelta(0)
    if after < anchor:
        assert got == anchor
    else:
        assert got - every <= after
    # Wall time plays no part: every zone gives the same instants, spaced exactly ``every``.
    utc = compile_interval(every, anchor, "UTC")
    series = [o.instant for o in preview(rec, after, 5)]
    assert series == [o.instant for o in preview(utc, after, 5)]
    assert all(b - a == every for a, b in pairwise(series))


@PROPS
@given(every=PERIODS, anchor=EPOCHS, after=EPOCHS, data=st.data())
def test_interval_window_and_preview(every: timedelta, anchor: datetime, after: datetime, data: st.DataObject) -> None:
    nb = anchor + timedelta(seconds=data.draw(st.integers(-86_400, 86_400 * 400)))
    na = nb + timedelta(seconds=data.draw(st.integers(0, 86_400 * 400)))
    rec = compile_interval(every, anchor, "UTC", not_before=nb, not_after=na)
    n = data.draw(st.integers(1, 6))
    got = [o.instant for o in preview(rec, after, n)]
    chained, t = [], after
    while len(chained) < n and (nxt := next_after(rec, t)) is not None:
        chained.append(nxt)
        t = nxt
    assert got == chained
    assert all(nb <= g <= na and (g - anchor) % every == timedelta(0) for g in got)
    # Nothing inside the window is skipped.
    if got:
        first_allowed = max(after + ONE_US, nb)
        k = -((anchor - first_allowed) // every) if first_allowed > anchor else 0
        assert got[0] == anchor + max(k, 0) * every


@PROPS
@given(at=EPOCHS, before=st.integers(1, 10**9), later=st.integers(0, 10**9))
def test_one_shot(at: datetime, before: int, later: int) -> None:
    rec = compile_once(at, "Europe/London")
    assert next_after(rec, at - timedelta(microseconds=before)) == at
    assert next_after(rec, at + timedelta(microseconds=later)) is None
    assert [o.instant for o in preview(rec, at - ONE_S, 5)] == [at]
    assert next_after(compile_once(at, "UTC", not_after=at - ONE_US), at - ONE_S) is None
    assert next_after(compile_once(at, "UTC", not_before=at + ONE_US), at - ONE_S) is None
    assert next_after(compile_once(at, "UTC", not_before=at, not_after=at), at - ONE_S) == at


# ----------------------------------------------------------------------------------------------
# Zone data comes from the pinned package


def test_load_zone_matches_the_pinned_package() -> None:
    for name in ZONES:
        ours = load_zone(name)
        for t, before, new in transitions(name):
            assert (t - ONE_S).astimezone(ours).utcoffset() == before
            assert t.astimezone(ours).utcoffset() == new


@pytest.mark.parametrize("kind", ["cron", "interval", "once"])
def test_window_is_inclusive_at_both_ends(kind: str) -> None:
    nb, na = datetime(2026, 1, 2, 9, tzinfo=UTC), datetime(2026, 1, 4, 9, tzinfo=UTC)
    if kind == "cron":
        rec = compile_cron("0 9 * * *", "UTC", not_before=nb, not_after=na)
    elif kind == "interval":
        rec = compile_interval("1d", datetime(2025, 12, 1, 9, tzinfo=UTC), "UTC", not_before=nb, not_after=na)
    else:
        rec = compile_once(nb, "UTC", not_before=nb, not_after=nb)
    expected = [nb, nb + timedelta(days=1), na] if kind != "once" else [nb]
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert [o.instant for o in preview(rec, start, 10)] == expected
    assert next_after(rec, start) == nb
    assert next_after(rec, expected[-1]) is None
