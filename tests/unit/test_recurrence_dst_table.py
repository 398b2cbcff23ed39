"""Transition table: exact UTC instants across both 2026 DST transitions (DESIGN.md §2 invariant 6).

Every expected instant below is a literal, worked out from the 2026 rules and checked against plain
zoneinfo arithmetic on the pinned tzdata (brute force: walk UTC minute by minute and fire whenever
the wall clock passes a matching wall time it has not shown before). The 2026 transitions:

=================== ========================== ==================================================
zone                transition (UTC)           wall clock
=================== ========================== ==================================================
Europe/London       2026-03-29T01:00Z          01:00 GMT -> 02:00 BST   (gap 01:00-02:00)
                    2026-10-25T01:00Z          02:00 BST -> 01:00 GMT   (fold 01:00-02:00)
America/New_York    2026-03-08T07:00Z          02:00 EST -> 03:00 EDT   (gap 02:00-03:00)
                    2026-11-01T06:00Z          02:00 EDT -> 01:00 EST   (fold 01:00-02:00)
Australia/Sydney    2026-04-04T16:00Z          03:00 AEDT -> 02:00 AEST (fold 02:00-03:00, Apr 5)
                    2026-10-03T16:00Z          02:00 AEST -> 03:00 AEDT (gap 02:00-03:00, Oct 4)
Australia/Lord_Howe 2026-04-04T15:00Z          02:00 +11 -> 01:30 +1030 (fold 01:30-02:00, Apr 5)
                    2026-10-03T15:30Z          02:00 +1030 -> 02:30 +11 (gap 02:00-02:30, Oct 4)
=================== ========================== ==================================================

Rules: a wall time in a gap fires at the transition instant (several collapse into one); a wall time
in a fold fires at its first occurrence only. An expected entry ``"<instant> gap"`` / ``"<instant>
fold"`` also pins the ``note`` that :func:`preview` reports for it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

import pytest
import tzdata

from fireledger.recurrence import TZDATA_VERSION, compile_cron, load_zone, next_after, preview


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _fmt(instant: datetime) -> str:
    assert instant.utcoffset() == timedelta(0)
    return instant.strftime("%Y-%m-%dT%H:%M:%SZ")


def P(case_id: str, zone: str, expr: str, start: str, expected: list[str]) -> object:
    return pytest.param(zone, expr, start, expected, id=case_id)


TABLE = [
    P("London-spring-gap-daily-02:30", "Europe/London", "30 2 * * *", "2026-03-27T01:00:00Z", [
        "2026-03-27T02:30:00Z", "2026-03-28T02:30:00Z", "2026-03-29T01:30:00Z",
        "2026-03-30T01:30:00Z",
    ]),
    P("London-spring-gap-daily-09:00", "Europe/London", "0 9 * * *", "2026-03-27T01:00:00Z", [
        "2026-03-27T09:00:00Z", "2026-03-28T09:00:00Z", "2026-03-29T08:00:00Z",
        "2026-03-30T08:00:00Z",
    ]),
    P("London-spring-gap-hourly-xx:30", "Europe/London", "30 * * * *", "2026-03-28T22:00:00Z", [
        "2026-03-28T22:30:00Z", "2026-03-28T23:30:00Z", "2026-03-29T00:30:00Z",
        "2026-03-29T01:00:00Z gap", "2026-03-29T01:30:00Z", "2026-03-29T02:30:00Z",
    ]),
    P("London-spring-gap-hourly-xx:00", "Europe/London", "0 * * * *", "2026-03-28T22:00:00Z", [
        "2026-03-28T23:00:00Z", "2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z gap",
        "2026-03-29T02:00:00Z", "2026-03-29T03:00:00Z", "2026-03-29T04:00:00Z",
    ]),
    P("London-spring-gap-every-15min", "Europe/London", "*/15 * * * *", "2026-03-28T23:30:00Z", [
        "2026-03-28T23:45:00Z", "2026-03-29T00:00:00Z", "2026-03-29T00:15:00Z",
        "2026-03-29T00:30:00Z", "2026-03-29T00:45:00Z", "2026-03-29T01:00:00Z gap",
        "2026-03-29T01:15:00Z", "2026-03-29T01:30:00Z", "2026-03-29T01:45:00Z",
        "2026-03-29T02:00:00Z", "2026-03-29T02:15:00Z", "2026-03-29T02:30:00Z",
    ]),
    P("London-spring-gap-daily-01:30", "Europe/London", "30 1 * * *", "2026-03-27T01:00:00Z", [
        "2026-03-27T01:30:00Z", "2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z gap",
        "2026-03-30T00:30:00Z",
    ]),
    P("London-spring-gap-6field-01:30-every20s", "Europe/London", "*/20 30 1 * * *", "2026-03-28T23:00:00Z", [
        "2026-03-29T01:00:00Z gap", "2026-03-30T00:30:00Z", "2026-03-30T00:30:20Z",
        "2026-03-30T00:30:40Z",
    ]),
    P("London-fall-fold-daily-02:30", "Europe/London", "30 2 * * *", "2026-10-23T01:00:00Z", [
        "2026-10-23T01:30:00Z", "2026-10-24T01:30:00Z", "2026-10-25T02:30:00Z",
        "2026-10-26T02:30:00Z",
    ]),
    P("London-fall-fold-daily-09:00", "Europe/London", "0 9 * * *", "2026-10-23T01:00:00Z", [
        "2026-10-23T08:00:00Z", "2026-10-24T08:00:00Z", "2026-10-25T09:00:00Z",
        "2026-10-26T09:00:00Z",
    ]),
    P("London-fall-fold-hourly-xx:30", "Europe/London", "30 * * * *", "2026-10-24T22:00:00Z", [
        "2026-10-24T22:30:00Z", "2026-10-24T23:30:00Z", "2026-10-25T00:30:00Z fold",
        "2026-10-25T02:30:00Z", "2026-10-25T03:30:00Z", "2026-10-25T04:30:00Z",
    ]),
    P("London-fall-fold-hourly-xx:00", "Europe/London", "0 * * * *", "2026-10-24T22:00:00Z", [
        "2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z fold", "2026-10-25T02:00:00Z",
        "2026-10-25T03:00:00Z", "2026-10-25T04:00:00Z", "2026-10-25T05:00:00Z",
    ]),
    P("London-fall-fold-every-15min", "Europe/London", "*/15 * * * *", "2026-10-24T23:30:00Z", [
        "2026-10-24T23:45:00Z", "2026-10-25T00:00:00Z fold", "2026-10-25T00:15:00Z fold",
        "2026-10-25T00:30:00Z fold", "2026-10-25T00:45:00Z fold", "2026-10-25T02:00:00Z",
        "2026-10-25T02:15:00Z", "2026-10-25T02:30:00Z", "2026-10-25T02:45:00Z",
        "2026-10-25T03:00:00Z", "2026-10-25T03:15:00Z", "2026-10-25T03:30:00Z",
    ]),
    P("London-fall-fold-daily-01:30", "Europe/London", "30 1 * * *", "2026-10-23T01:00:00Z", [
        "2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z fold", "2026-10-26T01:30:00Z",
        "2026-10-27T01:30:00Z",
    ]),
    P("London-fall-fold-6field-01:30-every20s", "Europe/London", "*/20 30 1 * * *", "2026-10-24T23:00:00Z", [
        "2026-10-25T00:30:00Z fold", "2026-10-25T00:30:20Z fold", "2026-10-25T00:30:40Z fold",
        "2026-10-26T01:30:00Z",
    ]),
    P("NewYork-spring-gap-daily-02:30", "America/New_York", "30 2 * * *", "2026-03-06T07:00:00Z", [
        "2026-03-06T07:30:00Z", "2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z gap",
        "2026-03-09T06:30:00Z",
    ]),
    P("NewYork-spring-gap-daily-09:00", "America/New_York", "0 9 * * *", "2026-03-06T07:00:00Z", [
        "2026-03-06T14:00:00Z", "2026-03-07T14:00:00Z", "2026-03-08T13:00:00Z",
        "2026-03-09T13:00:00Z",
    ]),
    P("NewYork-spring-gap-hourly-xx:30", "America/New_York", "30 * * * *", "2026-03-08T04:00:00Z", [
        "2026-03-08T04:30:00Z", "2026-03-08T05:30:00Z", "2026-03-08T06:30:00Z",
        "2026-03-08T07:00:00Z gap", "2026-03-08T07:30:00Z", "2026-03-08T08:30:00Z",
    ]),
    P("NewYork-spring-gap-hourly-xx:00", "America/New_York", "0 * * * *", "2026-03-08T04:00:00Z", [
        "2026-03-08T05:00:00Z", "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z gap",
        "2026-03-08T08:00:00Z", "2026-03-08T09:00:00Z", "2026-03-08T10:00:00Z",
    ]),
    P("NewYork-spring-gap-every-15min", "America/New_York", "*/15 * * * *", "2026-03-08T05:30:00Z", [
        "2026-03-08T05:45:00Z", "2026-03-08T06:00:00Z", "2026-03-08T06:15:00Z",
        "2026-03-08T06:30:00Z", "2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z gap",
        "2026-03-08T07:15:00Z", "2026-03-08T07:30:00Z", "2026-03-08T07:45:00Z",
        "2026-03-08T08:00:00Z", "2026-03-08T08:15:00Z", "2026-03-08T08:30:00Z",
    ]),
    P("NewYork-spring-gap-6field-every30min", "America/New_York", "0 */30 * * * *", "2026-03-08T06:00:00Z", [
        "2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z gap", "2026-03-08T07:30:00Z",
        "2026-03-08T08:00:00Z", "2026-03-08T08:30:00Z", "2026-03-08T09:00:00Z",
    ]),
    P("NewYork-fall-fold-daily-02:30", "America/New_York", "30 2 * * *", "2026-10-30T06:00:00Z", [
        "2026-10-30T06:30:00Z", "2026-10-31T06:30:00Z", "2026-11-01T07:30:00Z",
        "2026-11-02T07:30:00Z",
    ]),
    P("NewYork-fall-fold-daily-09:00", "America/New_York", "0 9 * * *", "2026-10-30T06:00:00Z", [
        "2026-10-30T13:00:00Z", "2026-10-31T13:00:00Z", "2026-11-01T14:00:00Z",
        "2026-11-02T14:00:00Z",
    ]),
    P("NewYork-fall-fold-hourly-xx:30", "America/New_York", "30 * * * *", "2026-11-01T03:00:00Z", [
        "2026-11-01T03:30:00Z", "2026-11-01T04:30:00Z", "2026-11-01T05:30:00Z fold",
        "2026-11-01T07:30:00Z", "2026-11-01T08:30:00Z", "2026-11-01T09:30:00Z",
    ]),
    P("NewYork-fall-fold-hourly-xx:00", "America/New_York", "0 * * * *", "2026-11-01T03:00:00Z", [
        "2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z fold", "2026-11-01T07:00:00Z",
        "2026-11-01T08:00:00Z", "2026-11-01T09:00:00Z", "2026-11-01T10:00:00Z",
    ]),
    P("NewYork-fall-fold-every-15min", "America/New_York", "*/15 * * * *", "2026-11-01T04:30:00Z", [
        "2026-11-01T04:45:00Z", "2026-11-01T05:00:00Z fold", "2026-11-01T05:15:00Z fold",
        "2026-11-01T05:30:00Z fold", "2026-11-01T05:45:00Z fold", "2026-11-01T07:00:00Z",
        "2026-11-01T07:15:00Z", "2026-11-01T07:30:00Z", "2026-11-01T07:45:00Z",
        "2026-11-01T08:00:00Z", "2026-11-01T08:15:00Z", "2026-11-01T08:30:00Z",
    ]),
    P("NewYork-fall-fold-6field-every30min", "America/New_York", "0 */30 * * * *", "2026-11-01T05:00:00Z", [
        "2026-11-01T05:30:00Z fold", "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z",
        "2026-11-01T08:00:00Z", "2026-11-01T08:30:00Z", "2026-11-01T09:00:00Z",
    ]),
    P("Sydney-spring-gap-daily-02:30", "Australia/Sydney", "30 2 * * *", "2026-10-01T16:00:00Z", [
        "2026-10-01T16:30:00Z", "2026-10-02T16:30:00Z", "2026-10-03T16:00:00Z gap",
        "2026-10-04T15:30:00Z",
    ]),
    P("Sydney-spring-gap-daily-09:00", "Australia/Sydney", "0 9 * * *", "2026-10-01T16:00:00Z", [
        "2026-10-01T23:00:00Z", "2026-10-02T23:00:00Z", "2026-10-03T22:00:00Z",
        "2026-10-04T22:00:00Z",
    ]),
    P("Sydney-spring-gap-hourly-xx:30", "Australia/Sydney", "30 * * * *", "2026-10-03T13:00:00Z", [
        "2026-10-03T13:30:00Z", "2026-10-03T14:30:00Z", "2026-10-03T15:30:00Z",
        "2026-10-03T16:00:00Z gap", "2026-10-03T16:30:00Z", "2026-10-03T17:30:00Z",
    ]),
    P("Sydney-spring-gap-hourly-xx:00", "Australia/Sydney", "0 * * * *", "2026-10-03T13:00:00Z", [
        "2026-10-03T14:00:00Z", "2026-10-03T15:00:00Z", "2026-10-03T16:00:00Z gap",
        "2026-10-03T17:00:00Z", "2026-10-03T18:00:00Z", "2026-10-03T19:00:00Z",
    ]),
    P("Sydney-spring-gap-every-15min", "Australia/Sydney", "*/15 * * * *", "2026-10-03T14:30:00Z", [
        "2026-10-03T14:45:00Z", "2026-10-03T15:00:00Z", "2026-10-03T15:15:00Z",
        "2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z", "2026-10-03T16:00:00Z gap",
        "2026-10-03T16:15:00Z", "2026-10-03T16:30:00Z", "2026-10-03T16:45:00Z",
        "2026-10-03T17:00:00Z", "2026-10-03T17:15:00Z", "2026-10-03T17:30:00Z",
    ]),
    P("Sydney-fall-fold-daily-02:30", "Australia/Sydney", "30 2 * * *", "2026-04-02T16:00:00Z", [
        "2026-04-03T15:30:00Z", "2026-04-04T15:30:00Z fold", "2026-04-05T16:30:00Z",
        "2026-04-06T16:30:00Z",
    ]),
    P("Sydney-fall-fold-daily-09:00", "Australia/Sydney", "0 9 * * *", "2026-04-02T16:00:00Z", [
        "2026-04-02T22:00:00Z", "2026-04-03T22:00:00Z", "2026-04-04T23:00:00Z",
        "2026-04-05T23:00:00Z",
    ]),
    P("Sydney-fall-fold-hourly-xx:30", "Australia/Sydney", "30 * * * *", "2026-04-04T13:00:00Z", [
        "2026-04-04T13:30:00Z", "2026-04-04T14:30:00Z", "2026-04-04T15:30:00Z fold",
        "2026-04-04T17:30:00Z", "2026-04-04T18:30:00Z", "2026-04-04T19:30:00Z",
    ]),
    P("Sydney-fall-fold-hourly-xx:00", "Australia/Sydney", "0 * * * *", "2026-04-04T13:00:00Z", [
        "2026-04-04T14:00:00Z", "2026-04-04T15:00:00Z fold", "2026-04-04T17:00:00Z",
        "2026-04-04T18:00:00Z", "2026-04-04T19:00:00Z", "2026-04-04T20:00:00Z",
    ]),
    P("Sydney-fall-fold-every-15min", "Australia/Sydney", "*/15 * * * *", "2026-04-04T14:30:00Z", [
        "2026-04-04T14:45:00Z", "2026-04-04T15:00:00Z fold", "2026-04-04T15:15:00Z fold",
        "2026-04-04T15:30:00Z fold", "2026-04-04T15:45:00Z fold", "2026-04-04T17:00:00Z",
        "2026-04-04T17:15:00Z", "2026-04-04T17:30:00Z", "2026-04-04T17:45:00Z",
        "2026-04-04T18:00:00Z", "2026-04-04T18:15:00Z", "2026-04-04T18:30:00Z",
    ]),
    P("LordHowe-spring-gap-daily-02:30", "Australia/Lord_Howe", "30 2 * * *", "2026-10-01T15:00:00Z", [
        "2026-10-01T16:00:00Z", "2026-10-02T16:00:00Z", "2026-10-03T15:30:00Z",
        "2026-10-04T15:30:00Z",
    ]),
    P("LordHowe-spring-gap-daily-09:00", "Australia/Lord_Howe", "0 9 * * *", "2026-10-01T15:00:00Z", [
        "2026-10-01T22:30:00Z", "2026-10-02T22:30:00Z", "2026-10-03T22:00:00Z",
        "2026-10-04T22:00:00Z",
    ]),
    P("LordHowe-spring-gap-hourly-xx:30", "Australia/Lord_Howe", "30 * * * *", "2026-10-03T12:30:00Z", [
        "2026-10-03T13:00:00Z", "2026-10-03T14:00:00Z", "2026-10-03T15:00:00Z",
        "2026-10-03T15:30:00Z", "2026-10-03T16:30:00Z", "2026-10-03T17:30:00Z",
    ]),
    P("LordHowe-spring-gap-hourly-xx:00", "Australia/Lord_Howe", "0 * * * *", "2026-10-03T12:30:00Z", [
        "2026-10-03T13:30:00Z", "2026-10-03T14:30:00Z", "2026-10-03T15:30:00Z gap",
        "2026-10-03T16:00:00Z", "2026-10-03T17:00:00Z", "2026-10-03T18:00:00Z",
    ]),
    P("LordHowe-spring-gap-every-15min", "Australia/Lord_Howe", "*/15 * * * *", "2026-10-03T14:00:00Z", [
        "2026-10-03T14:15:00Z", "2026-10-03T14:30:00Z", "2026-10-03T14:45:00Z",
        "2026-10-03T15:00:00Z", "2026-10-03T15:15:00Z", "2026-10-03T15:30:00Z gap",
        "2026-10-03T15:45:00Z", "2026-10-03T16:00:00Z", "2026-10-03T16:15:00Z",
        "2026-10-03T16:30:00Z", "2026-10-03T16:45:00Z", "2026-10-03T17:00:00Z",
    ]),
    P("LordHowe-spring-gap-daily-02:15", "Australia/Lord_Howe", "15 2 * * *", "2026-10-01T15:00:00Z", [
        "2026-10-01T15:45:00Z", "2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z gap",
        "2026-10-04T15:15:00Z",
    ]),
    P("LordHowe-spring-gap-daily-01:45", "Australia/Lord_Howe", "45 1 * * *", "2026-10-01T15:00:00Z", [
        "2026-10-01T15:15:00Z", "2026-10-02T15:15:00Z", "2026-10-03T15:15:00Z",
        "2026-10-04T14:45:00Z",
    ]),
    P("LordHowe-fall-fold-daily-02:30", "Australia/Lord_Howe", "30 2 * * *", "2026-04-02T15:00:00Z", [
        "2026-04-02T15:30:00Z", "2026-04-03T15:30:00Z", "2026-04-04T16:00:00Z",
        "2026-04-05T16:00:00Z",
    ]),
    P("LordHowe-fall-fold-daily-09:00", "Australia/Lord_Howe", "0 9 * * *", "2026-04-02T15:00:00Z", [
        "2026-04-02T22:00:00Z", "2026-04-03T22:00:00Z", "2026-04-04T22:30:00Z",
        "2026-04-05T22:30:00Z",
    ]),
    P("LordHowe-fall-fold-hourly-xx:30", "Australia/Lord_Howe", "30 * * * *", "2026-04-04T12:00:00Z", [
        "2026-04-04T12:30:00Z", "2026-04-04T13:30:00Z", "2026-04-04T14:30:00Z fold",
        "2026-04-04T16:00:00Z", "2026-04-04T17:00:00Z", "2026-04-04T18:00:00Z",
    ]),
    P("LordHowe-fall-fold-hourly-xx:00", "Australia/Lord_Howe", "0 * * * *", "2026-04-04T12:00:00Z", [
        "2026-04-04T13:00:00Z", "2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z",
        "2026-04-04T16:30:00Z", "2026-04-04T17:30:00Z", "2026-04-04T18:30:00Z",
    ]),
    P("LordHowe-fall-fold-every-15min", "Australia/Lord_Howe", "*/15 * * * *", "2026-04-04T13:30:00Z", [
        "2026-04-04T13:45:00Z", "2026-04-04T14:00:00Z", "2026-04-04T14:15:00Z",
        "2026-04-04T14:30:00Z fold", "2026-04-04T14:45:00Z fold", "2026-04-04T15:30:00Z",
        "2026-04-04T15:45:00Z", "2026-04-04T16:00:00Z", "2026-04-04T16:15:00Z",
        "2026-04-04T16:30:00Z", "2026-04-04T16:45:00Z", "2026-04-04T17:00:00Z",
    ]),
    P("LordHowe-fall-fold-daily-02:15", "Australia/Lord_Howe", "15 2 * * *", "2026-04-02T15:00:00Z", [
        "2026-04-02T15:15:00Z", "2026-04-03T15:15:00Z", "2026-04-04T15:45:00Z",
        "2026-04-05T15:45:00Z",
    ]),
    P("LordHowe-fall-fold-daily-01:45", "Australia/Lord_Howe", "45 1 * * *", "2026-04-02T15:00:00Z", [
        "2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z fold", "2026-04-05T15:15:00Z",
        "2026-04-06T15:15:00Z",
    ]),
    # Quartz W and year (decision 0143), same DST rules. W never lands on a Sunday, the day most zones
    # change, so its gap/fold rows use zones that change on a weekday: Asia/Jerusalem (gap Friday
    # 2026-03-27 02:00-03:00 IST, at 00:00Z) and Africa/Cairo (gap Friday 2026-04-24 00:00-01:00, at
    # 2026-04-23T22:00Z; fold Thursday 2026-10-29 23:00-24:00, first pass +03).
    P("London-29W-Sunday-to-Monday-after-the-gap", "Europe/London", "0 30 1 29W 3 ?", "2026-03-26T00:00:00Z", [
        "2026-03-30T00:30:00Z", "2027-03-29T00:30:00Z",
    ]),
    P("London-28W-Saturday-to-Friday-before-the-gap", "Europe/London", "0 30 1 28W 3 ?", "2026-03-26T00:00:00Z", [
        "2026-03-27T01:30:00Z", "2027-03-29T00:30:00Z",
    ]),
    P("Jerusalem-27W-Friday-gap", "Asia/Jerusalem", "0 30 2 27W 3 ?", "2026-03-26T00:00:00Z", [
        "2026-03-27T00:00:00Z gap", "2027-03-26T00:00:00Z gap",
    ]),
    P("Cairo-24W-Friday-gap", "Africa/Cairo", "0 30 0 24W 4 ?", "2026-04-20T00:00:00Z", [
        "2026-04-23T22:00:00Z gap", "2027-04-22T22:30:00Z",
    ]),
    P("Cairo-29W-Thursday-fold", "Africa/Cairo", "0 30 23 29W 10 ?", "2026-10-28T00:00:00Z", [
        "2026-10-29T20:30:00Z fold", "2027-10-29T21:30:00Z",
    ]),
    P("LordHowe-6W-Monday-after-the-fold", "Australia/Lord_Howe", "0 45 1 6W 4 ?", "2026-04-01T00:00:00Z", [
        "2026-04-05T15:15:00Z", "2027-04-05T15:15:00Z",
    ]),
    P("London-year-SUN#5-gap", "Europe/London", "0 30 1 ? 3 SUN#5 2026", "2026-01-01T00:00:00Z", [
        "2026-03-29T01:00:00Z gap",
    ]),
    P("London-year-list-fold", "Europe/London", "0 30 1 25 10 ? 2026,2027", "2026-10-01T00:00:00Z", [
        "2026-10-25T00:30:00Z fold", "2027-10-25T00:30:00Z",
    ]),
    P("NewYork-year-gap-walls-collapse", "America/New_York", "0 */20 2 8 3 ? 2026", "2026-03-07T00:00:00Z", [
        "2026-03-08T07:00:00Z gap",
    ]),
    P("NewYork-year-range-fold", "America/New_York", "0 30 1 1 11 ? 2026-2028", "2026-10-31T00:00:00Z", [
        "2026-11-01T05:30:00Z fold", "2027-11-01T05:30:00Z", "2028-11-01T05:30:00Z",
    ]),
    P("LordHowe-year-gap", "Australia/Lord_Howe", "0 15 2 4 10 ? 2026", "2026-10-01T00:00:00Z", [
        "2026-10-03T15:30:00Z gap",
    ]),
    P("LordHowe-year-step-fold", "Australia/Lord_Howe", "0 45 1 5 4 ? 2026/5", "2026-04-01T00:00:00Z", [
        "2026-04-04T14:45:00Z fold", "2031-04-04T14:45:00Z", "2036-04-04T14:45:00Z",
    ]),
]

#: The year rows whose years are over after their last expected instant: the recurrence is exhausted.
EXHAUSTED = {"London-year-SUN#5-gap", "London-year-list-fold", "NewYork-year-gap-walls-collapse",
             "NewYork-year-range-fold", "LordHowe-year-gap"}


@pytest.mark.parametrize(("zone", "expr", "start", "expected"), TABLE)
def test_transition_table(zone: str, expr: str, start: str, expected: list[str]) -> None:
    rec = compile_cron(expr, zone)
    # next_after, chained: the timing loop's view.
    got, after = [], _utc(start)
    for _ in expected:
        nxt = next_after(rec, after)
        assert nxt is not None
        got.append(_fmt(nxt))
        after = nxt
    assert got == [e.split()[0] for e in expected]
    # preview: the same instants, each with its DST note.
    occurrences = preview(rec, _utc(start), len(expected))
    assert [_fmt(o.instant) + (f" {o.note}" if o.note else "") for o in occurrences] == expected


@pytest.mark.parametrize(("zone", "expr", "start", "expected"),
                         [p for p in TABLE if p.id in EXHAUSTED])  # type: ignore[attr-defined]
def test_a_year_list_that_is_over_ends_the_recurrence(zone: str, expr: str, start: str, expected: list[str]) -> None:
    rec = compile_cron(expr, zone)
    last = _utc(expected[-1].split()[0])
    assert next_after(rec, last) is None
    assert preview(rec, _utc(start), len(expected) + 5) == preview(rec, _utc(start), len(expected))


@pytest.mark.parametrize(
    ("zone", "expr", "after", "expected"),
    [
        # Starting inside the second pass of a fold: the repeated wall times already fired.
        pytest.param("Europe/London", "30 * * * *", "2026-10-25T01:10:00Z", "2026-10-25T02:30:00Z",
                     id="London-inside-second-pass"),
        pytest.param("Europe/London", "*/15 * * * *", "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z",
                     id="London-at-fall-back-instant"),
        pytest.param("Europe/London", "*/15 * * * *", "2026-10-25T00:59:59Z", "2026-10-25T02:00:00Z",
                     id="London-last-second-of-first-pass"),
        pytest.param("Europe/London", "30 1 * * *", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z",
                     id="London-daily-fold-not-twice"),
        pytest.param("America/New_York", "0 1 * * *", "2026-11-01T04:59:59.999999Z", "2026-11-01T05:00:00Z",
                     id="NewYork-daily-01:00-first-pass"),
        pytest.param("America/New_York", "0 1 * * *", "2026-11-01T05:00:00Z", "2026-11-02T06:00:00Z",
                     id="NewYork-daily-01:00-not-again-in-second-pass"),
        pytest.param("Australia/Lord_Howe", "45 1 * * *", "2026-04-04T15:10:00Z", "2026-04-05T15:15:00Z",
                     id="LordHowe-inside-second-pass"),
        pytest.param("Australia/Sydney", "0 * * * *", "2026-04-04T16:30:00Z", "2026-04-04T17:00:00Z",
                     id="Sydney-inside-second-pass"),
        pytest.param("Europe/London", "*/20 30 1 * * *", "2026-10-25T00:30:20Z", "2026-10-25T00:30:40Z",
                     id="London-6field-within-first-pass"),
        pytest.param("Europe/London", "*/20 30 1 * * *", "2026-10-25T01:30:00Z", "2026-10-26T01:30:00Z",
                     id="London-6field-at-repeated-wall"),
        # Around a gap.
        pytest.param("Europe/London", "30 * * * *", "2026-03-29T00:59:59.500000Z", "2026-03-29T01:00:00Z",
                     id="London-half-second-before-gap"),
        pytest.param("Europe/London", "30 * * * *", "2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z",
                     id="London-at-spring-forward-instant"),
        pytest.param("America/New_York", "30 2 * * *", "2026-03-08T06:59:59Z", "2026-03-08T07:00:00Z",
                     id="NewYork-daily-in-gap"),
        pytest.param("America/New_York", "30 2 * * *", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z",
                     id="NewYork-daily-after-gap"),
    ],
)
def test_edge_starts(zone: str, expr: str, after: str, expected: str) -> None:
    nxt = next_after(compile_cron(expr, zone), _utc(after))
    assert nxt is not None and _fmt(nxt) == expected


def test_design_examples() -> None:
    """The two examples of the declared rules, verbatim."""
    london = compile_cron("30 * * * *", "Europe/London")
    spring = preview(london, _utc("2026-03-29T00:00:00Z"), 3)
    assert [_fmt(o.instant) for o in spring] == ["2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z",
                                                 "2026-03-29T01:30:00Z"]
    assert [o.note for o in spring] == [None, "gap", None]
    fall = preview(london, _utc("2026-10-24T23:00:00Z"), 3)
    assert [_fmt(o.instant) for o in fall] == ["2026-10-24T23:30:00Z", "2026-10-25T00:30:00Z",
                                               "2026-10-25T02:30:00Z"]
    assert [o.note for o in fall] == [None, "fold", None]


def test_gap_occurrence_keeps_the_wall_time_it_stands_for() -> None:
    occ = preview(compile_cron("45 2 * * *", "America/New_York"), _utc("2026-03-08T00:00:00Z"), 1)[0]
    assert (_fmt(occ.instant), occ.note) == ("2026-03-08T07:00:00Z", "gap")
    assert occ.wall is not None and occ.wall.replace(tzinfo=None) == datetime(2026, 3, 8, 2, 45)


@pytest.mark.parametrize(
    ("zone", "transition", "before_h", "after_h"),
    [
        pytest.param("Europe/London", "2026-03-29T01:00:00Z", 0, 1, id="London-spring"),
        pytest.param("Europe/London", "2026-10-25T01:00:00Z", 1, 0, id="London-fall"),
        pytest.param("America/New_York", "2026-03-08T07:00:00Z", -5, -4, id="NewYork-spring"),
        pytest.param("America/New_York", "2026-11-01T06:00:00Z", -4, -5, id="NewYork-fall"),
        pytest.param("Australia/Sydney", "2026-04-04T16:00:00Z", 11, 10, id="Sydney-fall"),
        pytest.param("Australia/Sydney", "2026-10-03T16:00:00Z", 10, 11, id="Sydney-spring"),
        pytest.param("Australia/Lord_Howe", "2026-04-04T15:00:00Z", 11, 10.5, id="LordHowe-fall"),
        pytest.param("Australia/Lord_Howe", "2026-10-03T15:30:00Z", 10.5, 11, id="LordHowe-spring"),
        pytest.param("Asia/Jerusalem", "2026-03-27T00:00:00Z", 2, 3, id="Jerusalem-spring-Friday"),
        pytest.param("Africa/Cairo", "2026-04-23T22:00:00Z", 2, 3, id="Cairo-spring-Friday"),
        pytest.param("Africa/Cairo", "2026-10-29T21:00:00Z", 3, 2, id="Cairo-fall-Thursday"),
    ],
)
def test_zone_data_has_the_2026_transitions(zone: str, transition: str, before_h: float, after_h: float) -> None:
    """The table above assumes these transitions; if a tzdata update moves one, this says so first."""
    t, z = _utc(transition), load_zone(zone)
    assert (t - timedelta(seconds=1)).astimezone(z).utcoffset() == timedelta(hours=before_h)
    assert t.astimezone(z).utcoffset() == timedelta(hours=after_h)


def test_tzdata_version_is_the_pinned_package() -> None:
    assert TZDATA_VERSION == tzdata.IANA_VERSION
    assert TZDATA_VERSION[:4].isdigit() and TZDATA_VERSION[4:].isalpha()


def test_zone_data_does_not_come_from_the_host(tmp_path: Path) -> None:
    """A host whose zone files disagree (here: "Europe/London" that is really UTC) changes nothing."""
    import zoneinfo

    fake = tmp_path / "Europe" / "London"
    fake.parent.mkdir()
    fake.write_bytes(resources.files("tzdata.zoneinfo").joinpath("UTC").read_bytes())
    zoneinfo.reset_tzpath(to=[str(tmp_path)])
    load_zone.cache_clear()
    try:
        summer = _utc("2026-07-01T12:00:00Z")
        assert summer.astimezone(zoneinfo.ZoneInfo.no_cache("Europe/London")).utcoffset() == timedelta(0)
        assert summer.astimezone(load_zone("Europe/London")).utcoffset() == timedelta(hours=1)
        nxt = next_after(compile_cron("0 9 * * *", "Europe/London"), summer)
        assert nxt == datetime(2026, 7, 2, 8, 0, tzinfo=UTC)
    finally:
        zoneinfo.reset_tzpath()
        load_zone.cache_clear()


def test_results_are_utc() -> None:
    nxt = next_after(compile_cron("0 9 * * *", "Asia/Kolkata"), _utc("2026-01-01T00:00:00Z"))
    assert nxt == datetime(2026, 1, 1, 3, 30, tzinfo=UTC)
