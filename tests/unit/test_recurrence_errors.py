"""Bad input to the recurrence compiler: a RecurrenceError naming the field and the problem (DESIGN.md §5)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fireledger.recurrence import (
    NoMatchError,
    RecurrenceError,
    compile_cron,
    compile_interval,
    compile_once,
    compile_spec,
    format_duration,
    format_instant,
    load_zone,
    next_after,
    parse_duration,
    parse_instant,
    preview,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("0 0 * * 8", "day-of-week: 8 is out of range 0-7"),
        ("60 * * * *", "minute: 60 is out of range 0-59"),
        ("0 24 * * *", "hour: 24 is out of range 0-23"),
        ("0 0 0 * *", "day-of-month: 0 is out of range 1-31"),
        ("0 0 32 * *", "day-of-month: 32 is out of range 1-31"),
        ("0 0 * 13 *", "month: 13 is out of range 1-12"),
        ("60 0 0 * * *", "second: 60 is out of range 0-59"),
        ("0 0 * FOO *", "month: 'FOO' is not a number or a month name (JAN-DEC)"),
        ("0 0 * * FUN", "day-of-week: 'FUN' is not a number or a day name (SUN-SAT)"),
        ("x * * * *", "minute: 'X' is not a number"),
        ("*/0 * * * *", "minute: step '0' must be a whole number of at least 1"),
        ("*/60 * * * *", "minute: step 60 is larger than the field's range 0-59"),
        ("0 0 * JAN-DEC/13 *", "month: step 13 is larger than the field's range 1-12"),
        ("0 5-1 * * *", "hour: range 5-1 runs backwards"),
        ("0 0 * * FRI-MON", "day-of-week: range FRI-MON runs backwards"),
        ("0 0 * * MON-", "day-of-week: a value is missing"),
        ("1,,2 * * * *", "minute: empty item in list '1,,2'"),
        ("0 0 L/2 * *", "day-of-month: L cannot take a step"),
        ("0 0 * * 5L,1", "day-of-week: 5L must stand alone"),
        ("0 0 * * 1#6", "day-of-week: #6 must be #1 to #5"),
        ("0 0 * * 1#0", "day-of-week: #0 must be #1 to #5"),
        ("* * * *", "cron: expected 5 fields (6 with leading seconds, 7 with seconds and a year), got 4"),
        ("* * * * * * * *", "cron: expected 5 fields (6 with leading seconds, 7 with seconds and a year), got 8"),
        # Quartz additions (decision 0143): W, ? and the year field.
        ("0 0 W * *", "day-of-month: W: W needs a day number 1-31 before it (e.g. 15W)"),
        ("0 0 32W * *", "day-of-month: 32 is out of range 1-31"),
        ("0 0 0W * *", "day-of-month: 0 is out of range 1-31"),
        ("0 0 1-5W * *", "day-of-month: 1-5W: W needs a day number 1-31 before it"),
        ("0 0 15W/2 * *", "day-of-month: 15W cannot take a step"),
        ("0 0 * * 1W", "day-of-week: '1W' is not a number or a day name (SUN-SAT)"),
        ("0 0 ? * ?", "day-of-week: ? in both day fields names no day"),
        ("0 ? * * *", "hour: ? (no specific value) is allowed only in day-of-month or day-of-week"),
        ("0 0 ?,1 * *", "day-of-month: '?,1': ? must stand alone"),
        ("0 0 * * ?/2", "day-of-week: '?/2': ? must stand alone"),
        ("0 0 0 1 1 ? 2300", "year: 2300 is out of range 1970-2199"),
        ("0 0 0 1 1 ? 1969", "year: 1969 is out of range 1970-2199"),
        ("0 0 0 1 1 ? 2030-2026", "year: range 2030-2026 runs backwards"),
        ("0 0 0 1 1 ? 2026/0", "year: step '0' must be a whole number of at least 1"),
        ("0 0 0 1 1 ? MMXXX", "year: 'MMXXX' is not a number"),
        ("0 0 0 1 1 ? 2026,", "year: empty item in list '2026,'"),
        ("", "cron: the expression is empty"),
        ("   ", "cron: the expression is empty"),
        ("@every", "cron: unknown alias '@every'"),
        ("0 " * 200, "cron: the expression is longer than 256 characters"),
        # Found while writing these tests: these used to escape as ValueError / a wrong NoMatchError.
        ("² * * * *", "minute: '²' is not a number"),
        ("١ * * * *", "minute: '١' is not a number"),
        ("*/² * * * *", "minute: step '²' must be a whole number of at least 1"),
        ("0 0 * * 1#2/2", "day-of-week: 1#2 cannot take a step"),
        ("0 0 * * 1#²", "day-of-week: #² must be #1 to #5"),
        ("0 0 * * MONL", "day-of-week: MONL: L needs a day number 0-7 before it"),
    ],
)
def test_bad_expression_names_the_field(expr: str, message: str) -> None:
    with pytest.raises(RecurrenceError) as info:
        compile_cron(expr, "UTC")
    assert not isinstance(info.value, NoMatchError)
    assert str(info.value).startswith(message)
    assert str(info.value) == f"{info.value.field}: {info.value.problem}"


@pytest.mark.parametrize(
    "expr",
    ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 31 FEB,APR *", "0 0 0 31 6 *", "0 0 30,31 2 *",
     "0 0 30W 2 *", "0 0 31W 4,6 ?", "0 0 0 30 2 ? 2030", "0 0 0 29 2 ? 2100", "0 0 0 29 2 ? 2097-2099"],
)
def test_expression_that_never_matches_is_refused_at_compile(expr: str) -> None:
    with pytest.raises(NoMatchError) as info:
        compile_cron(expr, "Europe/London")
    assert isinstance(info.value, RecurrenceError)
    assert info.value.field == "cron"
    assert "never matches" in info.value.problem


@pytest.mark.parametrize(
    "expr",
    ["0 0 29 2 *", "0 0 30 2 MON", "0 0 31 4,6,9,11 FRI", "0 0 31 * *", "0 0 * 2 MON#5",
     "0 0 29W 2 ?", "0 0 0 1 1 ? 2199", "0 0 0 29 2 ? 2100,2104", "0 0 0 ? 2 MON#5 2027-2199"],
)
def test_rare_but_real_expressions_compile(expr: str) -> None:
    # Feb 29 (leap years); OR with a weekday; the 31st of some month; a fifth Monday in February.
    assert next_after(compile_cron(expr, "UTC"), T0) is not None


def test_no_match_error_is_a_recurrence_error() -> None:
    assert issubclass(NoMatchError, RecurrenceError)
    assert issubclass(RecurrenceError, ValueError)


@pytest.mark.parametrize(
    ("expr", "zone"),
    [("* * * * *", "Mars/Olympus_Mons"), ("* * * * *", "europe/london"), ("* * * * *", ""),
     ("* * * * *", "../../etc/passwd"), ("* * * * *", "Europe/London "), ("* * * * *", "EST5EDT/x")],
)
def test_bad_zone(expr: str, zone: str) -> None:
    with pytest.raises(RecurrenceError) as info:
        compile_cron(expr, zone)
    assert info.value.field == "zone"
    with pytest.raises(RecurrenceError):
        load_zone(zone)


def test_aliases() -> None:
    daily = compile_cron("@daily", "UTC")
    assert daily.expression == "0 0 0 * * *"
    assert next_after(compile_cron("@HOURLY", "UTC"), T0) == T0 + timedelta(hours=1)
    assert next_after(compile_cron("@weekly", "UTC"), T0) == datetime(2026, 1, 4, tzinfo=UTC)  # a Sunday


# ----------------------------------------------------------------------------------------------
# Instants


@pytest.mark.parametrize(
    "text",
    ["2026-03-29T01:30:00", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-01-01T24:00:00Z",
     "2026-01-01T00:00:60Z", "2026-01-01T00:00:00+24:00", "2026-01-01T00:00:00+01:60", "yesterday", "",
     "2026-01-01", "1767225600", "0000-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00",
     "9999-12-31T23:59:59-01:00", "２０２６-01-01T00:00:00Z"],
)
def test_bad_instant(text: str) -> None:
    with pytest.raises(RecurrenceError) as info:
        parse_instant(text, "not_before")
    assert info.value.field == "not_before"


def test_instant_not_a_string() -> None:
    with pytest.raises(RecurrenceError):
        parse_instant(1767225600, "at")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-29T01:30:00Z", datetime(2026, 3, 29, 1, 30, tzinfo=UTC)),
        ("2026-03-29t01:30:00z", datetime(2026, 3, 29, 1, 30, tzinfo=UTC)),
        ("2026-03-29 02:30:00+01:00", datetime(2026, 3, 29, 1, 30, tzinfo=UTC)),
        ("2026-03-28T20:30:00-05:00", datetime(2026, 3, 29, 1, 30, tzinfo=UTC)),
        ("2026-03-29T01:30:00.5Z", datetime(2026, 3, 29, 1, 30, 0, 500_000, tzinfo=UTC)),
        ("2026-03-29T01:30:00.123456789Z", datetime(2026, 3, 29, 1, 30, 0, 123_456, tzinfo=UTC)),
    ],
)
def test_parse_instant(text: str, expected: datetime) -> None:
    got = parse_instant(text)
    assert got == expected and got.tzinfo is UTC


def test_format_instant() -> None:
    assert format_instant(datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC)) == "0999-01-02T03:04:05Z"
    assert format_instant(datetime(2026, 3, 29, 2, 30, tzinfo=timezone(timedelta(hours=1)))) == "2026-03-29T01:30:00Z"
    assert format_instant(datetime(2026, 3, 29, 1, 30, 0, 500, tzinfo=UTC)) == "2026-03-29T01:30:00.000500Z"


@settings(max_examples=200, deadline=None)
@given(st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30), timezones=st.just(UTC)))
def test_instant_round_trip(dt: datetime) -> None:
    assert parse_instant(format_instant(dt)) == dt


# ----------------------------------------------------------------------------------------------
# Durations


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90s", timedelta(seconds=90)), ("15m", timedelta(minutes=15)), ("1h", timedelta(hours=1)),
     ("24h", timedelta(days=1)), ("1h30m", timedelta(minutes=90)), ("500ms", timedelta(milliseconds=500)),
     ("2d", timedelta(days=2)), (" 1m ", timedelta(minutes=1)), ("1m1ms", timedelta(minutes=1, milliseconds=1))],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "  ", "90", "s", "1.5h", "-5m", "1w", "1 h", "1h 30m", "h1", "15M", "1hx", "99999999999999999999d", "1us",
     "٥s"],
)
def test_bad_duration(text: str) -> None:
    with pytest.raises(RecurrenceError) as info:
        parse_duration(text, "catchup_horizon")
    assert info.value.field == "catchup_horizon"


def test_duration_bounds() -> None:
    with pytest.raises(RecurrenceError, match=r"^catchup_horizon: '25h' is longer than the maximum 1d$"):
        parse_duration("25h", "catchup_horizon", maximum=timedelta(hours=24))
    with pytest.raises(RecurrenceError, match=r"^every: '0s' is shorter than the minimum 1s$"):
        parse_duration("0s", "every", minimum=timedelta(seconds=1))


@pytest.mark.parametrize(
    ("value", "text"),
    [(timedelta(seconds=90), "1m30s"), (timedelta(hours=1), "1h"), (timedelta(days=1, hours=1), "1d1h"),
     (timedelta(milliseconds=1500), "1s500ms"), (timedelta(0), "0s")],
)
def test_format_duration(value: timedelta, text: str) -> None:
    assert format_duration(value) == text


def test_format_duration_is_exact_for_long_durations() -> None:
    # 2**56 µs: value / timedelta(microseconds=1) as a float would end in ...992us.
    assert format_duration(timedelta(milliseconds=72_057_594_037_929)) == "833999d22h20m37s929ms"


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**15).map(lambda ms: timedelta(milliseconds=ms)))
def test_duration_round_trip(value: timedelta) -> None:
    text = format_duration(value)
    assert parse_duration(text) == value
    assert format_duration(parse_duration(text)) == text


# ----------------------------------------------------------------------------------------------
# Intervals, one-shots, windows, schedules


@pytest.mark.parametrize(
    ("every", "field", "problem"),
    [("0s", "every", "shorter than the minimum 1s"), ("1500ms", "every", "whole number of seconds"),
     ("ninety", "every", "is not a duration"), ("18301d", "every", "longer than the maximum"),
     (timedelta(0), "every", "between 1s and 50 years"), (timedelta(milliseconds=10), "every", "between 1s")],
)
def test_bad_interval(every: str | timedelta, field: str, problem: str) -> None:
    with pytest.raises(RecurrenceError) as info:
        compile_interval(every, T0)
    assert info.value.field == field and problem in info.value.problem


def test_bad_anchor_and_window() -> None:
    with pytest.raises(RecurrenceError) as info:
        compile_interval("90s", "soon")
    assert info.value.field == "anchor"
    with pytest.raises(RecurrenceError) as info:
        compile_interval("90s", datetime(2026, 1, 1))  # naive
    assert info.value.field == "anchor"
    with pytest.raises(RecurrenceError) as info:
        compile_cron("* * * * *", "UTC", not_before="2026-02-01T00:00:00Z", not_after="2026-01-01T00:00:00Z")
    assert str(info.value) == "not_after: is before not_before"
    with pytest.raises(RecurrenceError) as info:
        compile_once("2026-13-01T00:00:00Z")
    assert info.value.field == "at"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"cron": "0 0 * * 8", "zone": "UTC"}, "schedule.day-of-week: 8 is out of range 0-7"),
        ({"cron": "* * * * *", "zone": "Nowhere/Land"}, "schedule.zone: 'Nowhere/Land' is not an IANA zone"),
        ({"every": "0s", "anchor": "2026-01-01T00:00:00Z"}, "schedule.every: '0s' is shorter than the minimum 1s"),
        ({"every": "90s"}, "schedule.anchor: is required for an interval"),
        ({"at": "tomorrow"}, "schedule.at: 'tomorrow' is not an RFC 3339 instant"),
        ({"cron": "* * * * *", "every": "1m"}, "schedule: must have exactly one of cron, every, at"),
        ({}, "schedule: must have exactly one of cron, every, at"),
        ({"cron": "* * * * *", "tz": "UTC"}, "schedule.tz: is not a schedule field"),
        ({"cron": "* * * * *", "not_after": "2020-01-01"}, "schedule.not_after: '2020-01-01' is not an RFC 3339"),
        ("0 0 * * *", "schedule: must be an object with one of cron, every, at"),
    ],
)
def test_compile_spec_errors_are_prefixed(spec: object, message: str) -> None:
    with pytest.raises(RecurrenceError) as info:
        compile_spec(spec)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)
    assert info.value.field.startswith("schedule")


def test_compile_spec_no_match_keeps_its_class() -> None:
    with pytest.raises(NoMatchError) as info:
        compile_spec({"cron": "0 0 30 2 *", "zone": "UTC"})
    assert info.value.field == "schedule.cron"


def test_compile_spec_forms() -> None:
    cron = compile_spec({"cron": "0 9 * * 1-5", "zone": "Europe/Paris"})
    assert next_after(cron, T0) == datetime(2026, 1, 1, 8, 0, tzinfo=UTC)  # a Thursday, CET
    every = compile_spec({"every": "90s"}, default_anchor=T0)
    assert next_after(every, T0) == T0 + timedelta(seconds=90)
    once = compile_spec({"at": "2026-06-01T00:00:00+02:00"})
    assert [o.instant for o in preview(once, T0, 3)] == [datetime(2026, 5, 31, 22, tzinfo=UTC)]
    assert compile_spec(cron.spec()) == cron
    assert compile_spec(every.spec()) == every
    assert compile_spec(once.spec()) == once


# ----------------------------------------------------------------------------------------------
# The ends of the calendar: a clear error or an exhausted recurrence, never an OverflowError


def test_instants_near_the_end_of_the_calendar() -> None:
    end = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert next_after(compile_interval("90s", end - timedelta(seconds=30)), end - timedelta(seconds=1)) is None
    hourly = compile_interval("1h", end - timedelta(hours=2))
    assert [format_instant(o.instant) for o in preview(hourly, end - timedelta(hours=2), 5)] == [
        "9999-12-31T22:59:59Z", "9999-12-31T23:59:59Z"
    ]
    for zone in ("UTC", "America/New_York", "Pacific/Kiritimati"):
        with pytest.raises(NoMatchError):
            next_after(compile_cron("* * * * *", zone), end)
    assert next_after(compile_cron("0 0 * * *", "UTC"), datetime(9999, 1, 1, tzinfo=UTC)) == datetime(
        9999, 1, 2, tzinfo=UTC
    )
    with pytest.raises(NoMatchError):
        next_after(compile_cron("0 0 * * *", "America/New_York"), datetime(1, 1, 1, tzinfo=UTC))
