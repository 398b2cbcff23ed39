"""Exclusion calendars (decision 0156), pure: entries compiled and matched in their zones, problems
naming ``entries[i].<field>``, and the timing plane's annotation of a plan (an excluded pending fire
becomes ``skipped`` with a cause naming the calendar and entry; other records keep theirs; a union's
fires record their specs)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fireledger.domain.keys import to_us
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from fireledger.recurrence import RecurrenceError, compile_calendar, excluded, exclusion_cause
from fireledger.timing.exclusions import MissingCalendar, annotate, calendars_for

HOLIDAYS = [
    {"date": "2026-12-25", "zone": "Europe/London", "label": "Christmas"},
    {"from": "2026-08-01", "to": "2026-08-14", "zone": "America/New_York"},
    {"cron": "* * 1 1 *", "zone": "Australia/Lord_Howe", "label": "New Year"},
    {"cron": "0 12 * * 6"},
]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize(("instant", "entry"), [
    ("2026-12-25T00:00:00Z", 0), ("2026-12-25T23:59:59Z", 0), ("2026-12-24T23:59:59Z", None),
    # London is on GMT in December: its 25th is exactly the UTC day.
    ("2026-08-01T04:00:00Z", 1), ("2026-08-01T03:59:59Z", None),   # New York's 1 August starts 04:00 UTC (EDT)
    ("2026-08-15T03:59:00Z", 1), ("2026-08-15T04:00:00Z", None),   # the range's last day is included
    ("2026-12-31T13:00:00Z", 2), ("2026-12-31T12:59:59Z", None),   # Lord Howe is UTC+11 in summer
    ("2026-03-07T12:00:30Z", 3), ("2026-03-07T12:01:00Z", None),   # the whole matching minute
])
def test_entries_match_in_their_zone(instant: str, entry: int | None) -> None:
    cal = compile_calendar("holidays", HOLIDAYS)
    hit = excluded([cal], at(instant))
    assert (None if hit is None else hit[1].index) == entry


def test_the_cause_names_the_calendar_and_the_entry() -> None:
    cal = compile_calendar("holidays", HOLIDAYS)
    hit = excluded([cal], at("2026-12-25T09:00:00Z"))
    assert hit is not None
    assert exclusion_cause(*hit) == ("skipped: excluded by calendar 'holidays' entry 0 (2026-12-25 in "
                                     "Europe/London, 'Christmas')")
    cron_hit = excluded([cal], at("2026-03-07T12:00:00Z"))
    assert cron_hit is not None and "entry 3 (cron 0 12 * * 6 in UTC)" in exclusion_cause(*cron_hit)


@pytest.mark.parametrize(("entries", "field"), [
    ([{"date": "2026-02-30"}], "entries[0].date"),
    ([{"date": "25/12/2026"}], "entries[0].date"),
    ([{"from": "2026-08-14", "to": "2026-08-01"}], "entries[0].to"),
    ([{"from": "2026-08-14"}], "entries[0]"),
    ([{"date": "2026-08-14", "cron": "* * 1 1 *"}], "entries[0]"),
    ([{"date": "2026-08-14"}, {"cron": "0 0 12 25 12 *"}], "entries[1].cron"),   # 6 fields: refused
    ([{"cron": "* * 32 12 *"}], "entries[0].cron"),
    ([{"date": "2026-08-14", "zone": "Mars/Base"}], "entries[0].zone"),
    ([{"date": "2026-08-14", "label": "bell\x07"}], "entries[0].label"),
    ([{"date": "2026-08-14", "when": "x"}], "entries[0].when"),
    ([7], "entries[0]"),
    ("2026-08-14", "entries"),
])
def test_problems_name_the_entry_field(entries: object, field: str) -> None:
    with pytest.raises(RecurrenceError) as exc:
        compile_calendar("c", entries)
    assert exc.value.field == field


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 65, "é"])
def test_calendar_names_are_checked(name: str) -> None:
    with pytest.raises(RecurrenceError) as exc:
        compile_calendar(name, [])
    assert exc.value.field == "name"


zones = st.sampled_from(["UTC", "Europe/London", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"])


@settings(max_examples=200, deadline=None)
@given(zones, st.dates(date(2020, 1, 1), date(2030, 12, 31)), st.integers(-3 * 86400, 3 * 86400))
def test_a_date_excludes_exactly_its_local_day(zone: str, day: date, offset_s: int) -> None:
    cal = compile_calendar("d", [{"date": day.isoformat(), "zone": zone}])
    instant = datetime(day.year, day.month, day.day, 12, tzinfo=UTC) + timedelta(seconds=offset_s)
    local_day = instant.astimezone(ZoneInfo(zone)).date()
    assert (excluded([cal], instant) is not None) == (local_day == day)


def _fire(us: int, state: FireState = FireState.PENDING, cause: str | None = None) -> NewFire:
    return NewFire("t1", "tr1", us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, state, us, "2025b", "n1", cause,
                   not_before_us=us + 5 if state is FireState.PENDING else None)


def test_annotate_skips_excluded_pending_fires_and_records_specs() -> None:
    cal = compile_calendar("holidays", HOLIDAYS)
    xmas, boxing = to_us(at("2026-12-25T09:00:00Z")), to_us(at("2026-12-26T09:00:00Z"))
    expired = to_us(at("2026-12-25T08:00:00Z"))
    d = Decision(Advance("tr1", expired, 1, None, 1),
                 (_fire(expired, FireState.EXPIRED, "expired: missed"), _fire(xmas), _fire(boxing)))
    out = annotate(d, lambda us: (0, 2) if us == xmas else (1,), [cal])
    by = {f.scheduled_us: f for f in out.fires}
    assert by[expired].state is FireState.EXPIRED and by[expired].cause == "expired: missed"
    assert by[xmas].state is FireState.SKIPPED and by[xmas].not_before_us is None
    assert by[xmas].cause is not None and by[xmas].cause.startswith("skipped: excluded by calendar 'holidays' entry 0")
    assert by[boxing].state is FireState.PENDING and by[boxing].cause is None
    assert [by[u].specs for u in (expired, xmas, boxing)] == ["1", "0,2", "1"]
    assert out.advance == d.advance
    assert annotate(d, None, []) is d


def test_a_schedule_naming_a_missing_calendar_cannot_be_planned() -> None:
    cal = compile_calendar("holidays", HOLIDAYS)
    assert calendars_for("t1", ["holidays"], {("t1", "holidays"): cal}) == [cal]
    with pytest.raises(MissingCalendar, match="'gone'"):
        calendars_for("t1", ["holidays", "gone"], {("t1", "holidays"): cal})
