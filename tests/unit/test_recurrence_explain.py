"""``explain``: a schedule in words, with its zone and a computed DST sentence (decision 0144).

Each row is the whole sentence, written out: the wording of the fields cronsim knows is cronsim's,
the rest (W, the year, zone, DST) ours. The DST part names the zone's changes in the year after
``at`` and whether the schedule has wall times inside them.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fireledger.recurrence import compile_cron, compile_interval, compile_once, explain_schedule

AT = datetime(2026, 1, 1, tzinfo=UTC)
NO_DST_UTC = "UTC has no clock change in the year from 2026-01-01"
LONDON_NONE = ("clocks go forward on 2026-03-29, 01:00-02:00 does not exist and it has no wall time in that gap; "
               "clocks go back on 2026-10-25, 01:00-02:00 occurs twice and it has no wall time in the repeated "
               "period")
LONDON_BOTH = ("clocks go forward on 2026-03-29, 01:00-02:00 does not exist and it has wall times in that gap, "
               "which fire once at the jump (2026-03-29T01:00:00Z); clocks go back on 2026-10-25, 01:00-02:00 "
               "occurs twice and it has wall times in it, which fire on their first pass only")

TABLE = [
    ("0 9 * * 1-5", "Europe/London", f"At 09:00 on Monday through Friday, in Europe/London; DST: {LONDON_NONE}"),
    ("30 1 * * *", "Europe/London", f"At 01:30 every day, in Europe/London; DST: {LONDON_BOTH}"),
    ("*/15 * * * *", "Europe/London", f"Every 15th minute of every hour, in Europe/London; DST: {LONDON_BOTH}"),
    ("0 9 15W * ?", "UTC",
     f"At 09:00 on the weekday (Monday to Friday) nearest the 15th of the month (within the month), in UTC; "
     f"DST: {NO_DST_UTC}"),
    ("0 0 9 1W,15 * ?", "Asia/Kolkata",
     "At 09:00 on the weekday (Monday to Friday) nearest the first of the month (within the month) or on the "
     "15th day of month, in Asia/Kolkata; DST: Asia/Kolkata has no clock change in the year from 2026-01-01"),
    ("0 9 15W * MON", "UTC",
     "At 09:00 on the weekday (Monday to Friday) nearest the 15th of the month (within the month) and on "
     f"Monday, in UTC; DST: {NO_DST_UTC}"),
    ("0 9 LW * ?", "UTC", f"At 09:00 on the last weekday of every month, in UTC; DST: {NO_DST_UTC}"),
    ("0 0 12 ? * MON-FRI 2027,2029", "UTC",
     f"At 12:00 on Monday through Friday in 2027 and 2029, in UTC; DST: {NO_DST_UTC}"),
    ("0 0 0 1 1 ? 2026/2", "UTC",
     f"At 00:00 on January 1 every second year from 2026 through 2198, in UTC; DST: {NO_DST_UTC}"),
    ("0 0 9 1 * ? 2026-2030", "UTC",
     f"At 09:00 on the first day of every month in the years 2026 through 2030, in UTC; DST: {NO_DST_UTC}"),
    ("0 0 9 1 * ? 2031", "UTC", f"At 09:00 on the first day of every month in 2031 only, in UTC; DST: {NO_DST_UTC}"),
    ("0 15 2 ? 10 SUN#1 2026", "Australia/Lord_Howe",
     "At 02:15 on the first Sunday of the month in October in 2026 only, in Australia/Lord_Howe; DST: clocks go "
     "back on 2026-04-05, 01:30-02:00 occurs twice and it has no wall time in the repeated period; clocks go "
     "forward on 2026-10-04, 02:00-02:30 does not exist and it has wall times in that gap, which fire once at "
     "the jump (2026-10-03T15:30:00Z)"),
    ("45 1 * * *", "Australia/Lord_Howe",
     "At 01:45 every day, in Australia/Lord_Howe; DST: clocks go back on 2026-04-05, 01:30-02:00 occurs twice "
     "and it has wall times in it, which fire on their first pass only; clocks go forward on 2026-10-04, "
     "02:00-02:30 does not exist and it has no wall time in that gap"),
]


@pytest.mark.parametrize(("expr", "zone", "expected"), TABLE, ids=[row[0] for row in TABLE])
def test_explain_table(expr: str, zone: str, expected: str) -> None:
    assert explain_schedule(compile_cron(expr, zone), AT) == expected


def test_intervals_and_one_shots_say_dst_does_not_apply() -> None:
    assert explain_schedule(compile_interval("90s", AT, "Europe/London"), AT) == (
        "Every 1m30s from 2026-01-01T00:00:00Z (absolute time); DST: does not apply, an interval counts "
        "elapsed time, not wall time")
    assert explain_schedule(compile_once("2026-06-01T12:00:00Z"), AT) == (
        "Once, at 2026-06-01T12:00:00Z; DST: does not apply, the instant is absolute")
