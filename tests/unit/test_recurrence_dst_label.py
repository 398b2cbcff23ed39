"""DST labels per instant (issue 18 item 6): ``dst_label(compiled, instant)`` against exact dates.

The 2027 transitions used below (worked out from the rules, checked on the pinned tzdata):

=================== ======================= ==============================================
zone                transition (UTC)        wall clock
=================== ======================= ==============================================
Europe/London       2027-03-28T01:00Z       01:00 GMT -> 02:00 BST   (gap 01:00-02:00)
                    2027-10-31T01:00Z       02:00 BST -> 01:00 GMT   (fold 01:00-02:00)
America/New_York    2027-03-14T07:00Z       02:00 EST -> 03:00 EDT   (gap 02:00-03:00)
                    2027-11-07T06:00Z       02:00 EDT -> 01:00 EST   (fold 01:00-02:00)
Australia/Lord_Howe 2027-04-03T15:00Z       02:00 +11 -> 01:30 +1030 (fold 01:30-02:00, Apr 4)
                    2027-10-02T15:30Z       02:00 +1030 -> 02:30 +11 (gap 02:00-02:30, Oct 3)
=================== ======================= ==============================================

The 2026 transition table of ``test_recurrence_dst_table`` is replayed too: every instant it marks
``gap``/``fold`` gets that label, every other instant none.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fireledger.recurrence import UnionRecurrence, compile_cron, compile_interval, compile_once, compile_spec, preview
from fireledger.recurrence.dst import dst_label, dst_label_us, parse_dst_label
from test_recurrence_dst_table import TABLE


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


LABELS = [
    # zone, cron, instant (UTC), label
    ("Europe/London", "30 1 * * *", "2027-03-28T01:00:00Z", "gap 2027-03-28T01:30"),
    ("Europe/London", "30 1 * * *", "2027-10-31T00:30:00Z", "fold 2027-10-31T01:30"),
    ("Europe/London", "30 1 * * *", "2027-10-31T01:30:00Z", None),      # the second pass: not an instant
    ("Europe/London", "30 1 * * *", "2027-03-29T00:30:00Z", None),      # the day after: an ordinary wall time
    ("Europe/London", "*/15 1 * * *", "2027-03-28T01:00:00Z", "gap 2027-03-28T01:00"),   # four walls, one instant
    ("Europe/London", "0 2 * * *", "2027-03-28T01:00:00Z", None),       # 02:00 BST exists: the jump's target
    ("America/New_York", "30 2 * * *", "2027-03-14T07:00:00Z", "gap 2027-03-14T02:30"),
    ("America/New_York", "30 1 * * *", "2027-11-07T05:30:00Z", "fold 2027-11-07T01:30"),
    ("America/New_York", "30 1 * * *", "2027-11-06T05:30:00Z", None),
    ("America/New_York", "15 30 1 * * *", "2027-11-07T05:30:15Z", "fold 2027-11-07T01:30:15"),   # seconds
    ("Australia/Lord_Howe", "15 2 * * *", "2027-10-02T15:30:00Z", "gap 2027-10-03T02:15"),
    ("Australia/Lord_Howe", "45 1 * * *", "2027-04-03T14:45:00Z", "fold 2027-04-04T01:45"),
    ("Australia/Lord_Howe", "15 1 * * *", "2027-04-03T14:15:00Z", None),   # 01:15 is before the fold
    ("Australia/Lord_Howe", "45 1 * * *", "2027-04-04T15:15:00Z", None),
]


@pytest.mark.parametrize(("zone", "expr", "instant", "label"), LABELS,
                         ids=[f"{z.split('/')[-1]}-{e}-{i}" for z, e, i, _ in LABELS])
def test_label_of_each_instant(zone: str, expr: str, instant: str, label: str | None) -> None:
    rec = compile_cron(expr, zone)
    at = _utc(instant)
    assert dst_label(rec, at) == label
    us = int((at - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
    assert dst_label_us(rec, us) == label


@pytest.mark.parametrize(("zone", "expr", "start", "expected"), TABLE)
def test_the_2026_transition_table_labels(zone: str, expr: str, start: str, expected: list[str]) -> None:
    rec = compile_cron(expr, zone)
    for entry, occ in zip(expected, preview(rec, _utc(start), len(expected)), strict=True):
        parts = entry.split()
        note = parts[1] if len(parts) > 1 else None
        got = dst_label(rec, occ.instant)
        if note is None:
            assert got is None, entry
        else:
            assert got is not None and got.split()[0] == note, entry
            assert parse_dst_label(got) == {"kind": note, "wall": got.split()[1]}


def test_intervals_and_one_shots_are_never_labelled() -> None:
    gap = _utc("2027-03-28T01:00:00Z")
    assert dst_label(compile_interval("30m", "2027-03-28T00:00:00Z", "Europe/London"), gap) is None
    assert dst_label(compile_once("2027-03-28T01:00:00Z", "Europe/London"), gap) is None
    assert dst_label_us(compile_once("2027-03-28T01:00:00Z", "Europe/London"), 0) is None


def test_a_union_carries_the_label_of_its_cron_spec_that_yields_the_instant() -> None:
    """Decision 0155 + 0160: several specs, one of them a cron in London whose 01:30 is skipped on
    2027-03-28; the union's fire at the jump is labelled, its interval-only instants are not."""
    union = compile_spec({"specs": [{"every": "1h", "anchor": "2027-03-27T00:10:00Z"},
                                    {"cron": "30 1 * * *", "zone": "Europe/London"}]})
    assert isinstance(union, UnionRecurrence)
    jump = _utc("2027-03-28T01:00:00Z")
    assert dst_label(union, jump) == "gap 2027-03-28T01:30"
    assert dst_label(union, _utc("2027-03-28T01:10:00Z")) is None   # the interval's instant
    assert dst_label(union, _utc("2027-03-29T00:30:00Z")) is None   # the cron's ordinary day
    assert dst_label_us(union, int((jump - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))) \
        == "gap 2027-03-28T01:30"
    plain = compile_spec({"specs": [{"every": "1h", "anchor": "2027-03-27T00:10:00Z"}, {"at": "2027-03-28T01:00:00Z"}]})
    assert dst_label(plain, jump) is None


def test_parse_refuses_what_is_not_a_label() -> None:
    assert parse_dst_label(None) is None
    assert parse_dst_label("") is None
    assert parse_dst_label("gap") is None
    assert parse_dst_label("spring 2027-03-28T01:30") is None
    assert parse_dst_label("fold 2027-10-31T01:30") == {"kind": "fold", "wall": "2027-10-31T01:30"}


ZONES = ["Europe/London", "America/New_York", "Australia/Lord_Howe", "Europe/Berlin", "UTC"]


@settings(max_examples=60, deadline=None)
@given(zone=st.sampled_from(ZONES), minute=st.integers(0, 59), hour=st.integers(0, 3),
       start_day=st.integers(0, 364))
def test_label_agrees_with_the_compiler(zone: str, minute: int, hour: int, start_day: int) -> None:
    """Property: over a week of daily instants, an instant is labelled exactly when the compiler's
    own occurrence carries a note, with the same kind and wall time."""
    rec = compile_cron(f"{minute} {hour} * * *", zone)
    start = datetime(2027, 1, 1, tzinfo=UTC) + timedelta(days=start_day)
    for occ in preview(rec, start, 7):
        got = parse_dst_label(dst_label(rec, occ.instant))
        if occ.note is None:
            assert got is None
        else:
            assert got is not None and got["kind"] == occ.note
            assert occ.wall is not None and got["wall"] == occ.wall.strftime("%Y-%m-%dT%H:%M")


def test_instants_at_the_edges_of_the_calendar_are_not_labelled() -> None:
    rec = compile_cron("30 1 * * *", "Europe/London")
    assert dst_label(rec, datetime(1, 1, 1, 1, 30, tzinfo=UTC)) is None
    assert dst_label(rec, datetime(9999, 12, 31, 1, 30, tzinfo=UTC)) is None


def test_the_cached_offset_changes_hold_the_2027_transitions() -> None:
    """The prefilter's per zone-year samples: each transition lies in the hour before its sample."""
    from fireledger.recurrence import load_zone
    from fireledger.recurrence.dst import _changes

    for zone, transitions in [("Europe/London", ["2027-03-28T01:00:00Z", "2027-10-31T01:00:00Z"]),
                              ("Australia/Lord_Howe", ["2027-04-03T15:00:00Z", "2027-10-02T15:30:00Z"]),
                              ("UTC", [])]:
        samples = _changes(load_zone(zone), 2027)
        assert len(samples) == len(transitions), zone
        for sample, t in zip(samples, transitions, strict=True):
            assert sample - 3600 < _utc(t).timestamp() <= sample, (zone, t)
