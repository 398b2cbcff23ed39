"""The timing loop's integer next-instant function equals ``next_us`` (the one definition of "when is it
due", through datetimes) for every instant: intervals and one-shots with and without a window, the
edges of the window and of the representable range included, and cron schedules (which use it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fireledger.definitions import next_fn, next_us
from fireledger.domain.keys import to_us
from fireledger.recurrence import Recurrence, compile_cron, compile_interval, compile_once

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LO, HI = to_us(datetime(1970, 1, 1, tzinfo=UTC)), to_us(datetime(2100, 1, 1, tzinfo=UTC))
US = st.integers(min_value=LO, max_value=HI)
MAX_US = to_us(datetime.max.replace(tzinfo=UTC))


def _iso(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


def _window(nb: int | None, span: int | None) -> dict[str, datetime]:
    out = {}
    if nb is not None:
        out["not_before"] = _iso(nb)
        if span is not None:
            out["not_after"] = _iso(nb + span)
    return out


def _same(rec: Recurrence, afters: list[int]) -> None:
    fast, slow = next_fn(rec), partial(next_us, rec)
    for a in afters:
        assert fast(a) == slow(a), (rec, a)


@PROPS
@given(anchor=US, every=st.integers(min_value=1, max_value=90 * 86_400).map(lambda s: s * 1_000_000), after=US,
       nb=st.none() | US, span=st.none() | st.integers(min_value=0, max_value=10 * 86_400_000_000))
def test_interval_matches_next_us(anchor: int, every: int, after: int, nb: int | None, span: int | None) -> None:
    rec = compile_interval(timedelta(microseconds=every), _iso(anchor), **_window(nb, span))
    edges = [after, anchor - 1, anchor, anchor + 1, anchor + every - 1, anchor + every]
    if nb is not None:
        edges += [nb - 1, nb, nb + 1]
    _same(rec, edges)


@PROPS
@given(at=US, after=US, nb=st.none() | US, span=st.none() | st.integers(min_value=0, max_value=86_400_000_000))
def test_one_shot_matches_next_us(at: int, after: int, nb: int | None, span: int | None) -> None:
    rec = compile_once(_iso(at), **_window(nb, span))
    _same(rec, [after, at - 1, at, at + 1, *([nb - 1, nb, nb + 1] if nb is not None else [])])


def test_interval_past_the_last_representable_instant_is_exhausted() -> None:
    rec = compile_interval(timedelta(days=400), datetime(9998, 6, 1, tzinfo=UTC))
    near_end = to_us(datetime(9999, 12, 1, tzinfo=UTC))
    assert next_fn(rec)(near_end) is None
    assert next_us(rec, near_end) is None
    _same(rec, [MAX_US - 1, MAX_US])


def test_out_of_range_instants_behave_as_next_us() -> None:
    rec = compile_interval(timedelta(seconds=1), datetime(2026, 1, 1, tzinfo=UTC))
    with pytest.raises(OverflowError):
        next_us(rec, MAX_US + 10)
    with pytest.raises(OverflowError):
        next_fn(rec)(MAX_US + 10)


@PROPS
@given(after=US)
def test_cron_goes_through_next_us(after: int) -> None:
    rec = compile_cron("30 2 * * *", "Europe/Paris")
    _same(rec, [after])
