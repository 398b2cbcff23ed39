"""`fireledger preview`, run as the real console script (DESIGN.md §4 preview contract, §5 bad input).

All invocations are started at once by a module fixture (each is a fresh interpreter), then checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

SCRIPT = Path(sys.executable).parent / "fireledger"


class Run(NamedTuple):
    code: int
    out: str
    err: str


GOOD: dict[str, list[str]] = {
    "json-gap": ["--expr", "30 * * * *", "--zone", "Europe/London", "--from", "2026-03-29T00:00:00Z",
                 "--count", "3", "--json"],
    "json-fold-6field": ["--expr", "*/20 30 1 * * *", "--zone", "Europe/London", "--from",
                         "2026-10-24T23:00:00Z", "--count", "4", "--json"],
    "json-offset-from": ["--expr", "0 9 * * 1-5", "--zone", "America/New_York", "--from",
                         "2026-03-06T10:00:00-05:00", "--count", "2", "--json"],
    "json-every": ["--every", "90s", "--from", "2026-01-01T00:00:00Z", "--count", "3", "--json"],
    "json-every-15m": ["--every", "15m", "--zone", "Europe/London", "--from", "2026-03-29T00:50:00Z",
                       "--count", "2", "--json"],
    "json-at": ["--at", "2026-06-01T12:00:00+02:00", "--from", "2026-01-01T00:00:00Z", "--count", "5", "--json"],
    "json-at-past": ["--at", "2025-06-01T12:00:00Z", "--from", "2026-01-01T00:00:00Z", "--json"],
    "table-gap": ["--expr", "30 * * * *", "--zone", "Europe/London", "--from", "2026-03-29T00:00:00Z",
                  "--count", "3"],
    "table-fold": ["--expr", "30 * * * *", "--zone", "Europe/London", "--from", "2026-10-24T23:00:00Z",
                   "--count", "3"],
    "end-of-calendar": ["--every", "90s", "--from", "9999-12-31T23:59:00Z", "--json"],
    # Quartz W, ? and the year (decision 0143); --explain (decision 0144).
    "json-quartz-w-year": ["--expr", "0 30 2 27W 3 ? 2026,2027", "--zone", "Asia/Jerusalem", "--from",
                           "2026-01-01T00:00:00Z", "--count", "5", "--json"],
    "explain-json": ["--expr", "0 30 1 * * *", "--zone", "Europe/London", "--from", "2026-01-01T00:00:00Z",
                     "--count", "1", "--json", "--explain"],
    "explain-table": ["--expr", "0 9 15W * ?", "--from", "2026-01-01T00:00:00Z", "--count", "2", "--explain"],
    # Several specs (decision 0155): the union, each instant naming its specs.
    "json-union": ["--schedule", '{"specs": [{"cron": "0 * * * *", "zone": "Europe/London"}, {"every": "90m", '
                   '"anchor": "2026-03-28T00:00:00Z"}]}', "--from", "2026-03-28T23:59:00Z", "--count", "4", "--json"],
}

BAD: dict[str, tuple[list[str], str]] = {
    "bad-expr-range": (["--expr", "0 0 * * 8"], "day-of-week: 8 is out of range 0-7"),
    "bad-expr-fields": (["--expr", "* * *"], "expected 5 fields"),
    "bad-expr-never": (["--expr", "0 0 30 2 *"], "never matches"),
    "bad-expr-unicode-digit": (["--expr", "² * * * *"], "minute: '²' is not a number"),
    "bad-expr-name-L": (["--expr", "0 0 * * MONL"], "day-of-week"),
    "bad-expr-year": (["--expr", "0 0 0 1 1 ? 2300"], "--expr: year: 2300 is out of range 1970-2199"),
    "bad-expr-w": (["--expr", "0 0 W * ?"], "--expr: day-of-month: W: W needs a day number"),
    "bad-expr-two-?": (["--expr", "0 0 ? * ?"], "--expr: day-of-week: ? in both day fields"),
    "bad-zone": (["--expr", "* * * * *", "--zone", "Mars/Base"], "--zone: 'Mars/Base' is not an IANA zone"),
    "bad-from": (["--expr", "* * * * *", "--from", "yesterday"], "--from: 'yesterday' is not an RFC 3339"),
    "bad-from-naive": (["--expr", "* * * * *", "--from", "2026-01-01T00:00:00"], "--from:"),
    "bad-from-date": (["--expr", "* * * * *", "--from", "2026-02-30T00:00:00Z"], "--from:"),
    "bad-count-zero": (["--expr", "* * * * *", "--count", "0"], "--count"),
    "bad-count-big": (["--expr", "* * * * *", "--count", "10001"], "--count"),
    "bad-count-text": (["--expr", "* * * * *", "--count", "x"], "--count"),
    "bad-every": (["--every", "0s"], "--every"),
    "bad-every-huge": (["--every", "99999999999999999999d"], "--every"),
    "bad-every-text": (["--every", "often"], "--every"),
    "bad-at": (["--at", "noon"], "--at"),
    "bad-schedule-spec": (["--schedule", '{"specs": [{"cron": "0 9 * * *"}, {"cron": "0 0 * * 8"}]}'],
                          "--schedule: schedule.specs[1].cron: day-of-week: 8 is out of range 0-7"),
    "bad-schedule-json": (["--schedule", "{specs"], "--schedule: is not JSON"),
    "unknown-option": (["--expr", "* * * * *", "--bogus"], "--bogus"),
    "no-form": (["--count", "3"], "exactly one of --expr, --every, --at"),
    "two-forms": (["--expr", "* * * * *", "--at", "2026-01-01T00:00:00Z"], "exactly one of --expr, --every, --at"),
    "three-forms": (["--expr", "* * * * *", "--every", "1m", "--at", "2026-01-01T00:00:00Z"], "exactly one of"),
}


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Run]]:
    assert SCRIPT.exists(), f"console script not installed next to {sys.executable}"
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    cases = {**GOOD, **{k: v[0] for k, v in BAD.items()}}
    procs = {
        name: subprocess.Popen([str(SCRIPT), "preview", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, encoding="utf-8")
        for name, args in cases.items()
    }
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        results[name] = Run(proc.returncode, out, err)
    yield results


def _json(run: Run) -> list[dict[str, object]]:
    assert run.code == 0, run.err
    assert run.err == ""
    data = json.loads(run.out)
    assert isinstance(data, list)
    for item in data:
        assert isinstance(item, dict)
        instant = item["instant"]
        assert isinstance(instant, str) and instant.endswith("Z")
    return data


def test_json_gap(runs: dict[str, Run]) -> None:
    data = _json(runs["json-gap"])
    assert [d["instant"] for d in data] == ["2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z"]
    assert [d.get("dst") for d in data] == [None, "gap", None]
    assert all(d["tzdata_version"] == data[0]["tzdata_version"] for d in data)
    import tzdata

    assert data[0]["tzdata_version"] == tzdata.IANA_VERSION


def test_json_fold_six_fields(runs: dict[str, Run]) -> None:
    data = _json(runs["json-fold-6field"])
    assert [d["instant"] for d in data] == [
        "2026-10-25T00:30:00Z", "2026-10-25T00:30:20Z", "2026-10-25T00:30:40Z", "2026-10-26T01:30:00Z",
    ]
    assert [d.get("dst") for d in data] == ["fold", "fold", "fold", None]


def test_json_from_with_offset(runs: dict[str, Run]) -> None:
    # From Fri 2026-03-06 10:00 EST: Mon 03-09 09:00 EDT (13:00Z) -- the weekend and DST change between.
    assert [d["instant"] for d in _json(runs["json-offset-from"])] == ["2026-03-09T13:00:00Z", "2026-03-10T13:00:00Z"]


def test_json_every(runs: dict[str, Run]) -> None:
    assert [d["instant"] for d in _json(runs["json-every"])] == [
        "2026-01-01T00:01:30Z", "2026-01-01T00:03:00Z", "2026-01-01T00:04:30Z",
    ]
    # Intervals are absolute: 15 minutes apart in UTC across the London gap.
    assert [d["instant"] for d in _json(runs["json-every-15m"])] == ["2026-03-29T01:05:00Z", "2026-03-29T01:20:00Z"]


def test_json_at(runs: dict[str, Run]) -> None:
    assert [d["instant"] for d in _json(runs["json-at"])] == ["2026-06-01T10:00:00Z"]
    assert _json(runs["json-at-past"]) == []


def test_table_shows_dst_notes(runs: dict[str, Run]) -> None:
    gap, fold = runs["table-gap"], runs["table-fold"]
    assert gap.code == 0 and fold.code == 0, (gap.err, fold.err)
    assert "2026-03-29T01:00:00Z" in gap.out and "DST gap" in gap.out
    assert "DST fold" not in gap.out
    assert "2026-10-25T00:30:00Z" in fold.out and "DST fold" in fold.out
    assert "2026-10-25T01:30:00Z" not in fold.out


def test_quartz_w_and_year_through_the_cli(runs: dict[str, Run]) -> None:
    # 27W in March: Friday 2026-03-27 and Friday 2027-03-26, both in Jerusalem's Friday gap; then the
    # years are over and the schedule has no further instant.
    data = _json(runs["json-quartz-w-year"])
    assert [(d["instant"], d.get("dst")) for d in data] == [("2026-03-27T00:00:00Z", "gap"),
                                                             ("2027-03-26T00:00:00Z", "gap")]


def test_explain(runs: dict[str, Run]) -> None:
    run = runs["explain-json"]
    assert run.code == 0, run.err
    data = json.loads(run.out)
    assert data["explanation"] == (
        "At 01:30 every day, in Europe/London; DST: clocks go forward on 2026-03-29, 01:00-02:00 does not "
        "exist and it has wall times in that gap, which fire once at the jump (2026-03-29T01:00:00Z); clocks "
        "go back on 2026-10-25, 01:00-02:00 occurs twice and it has wall times in it, which fire on their "
        "first pass only")
    assert [d["instant"] for d in data["instants"]] == ["2026-01-01T01:30:00Z"]
    table = runs["explain-table"]
    assert table.code == 0, table.err
    assert table.out.startswith("At 09:00 on the weekday (Monday to Friday) nearest the 15th of the month "
                                "(within the month), in UTC; DST: UTC has no clock change")
    assert "2026-01-15T09:00:00Z" in table.out and "2026-02-16T09:00:00Z" in table.out


def test_end_of_calendar_is_not_a_crash(runs: dict[str, Run]) -> None:
    assert _json(runs["end-of-calendar"]) == []


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2(runs: dict[str, Run], case: str) -> None:
    run = runs[case]
    expected = BAD[case][1]
    assert run.code == 2, run
    assert "Traceback" not in run.err
    lines = run.err.strip("\n").split("\n")
    assert len(lines) == 1, run.err
    assert lines[0].startswith("fireledger:"), run.err
    assert expected in lines[0]
    assert run.out == ""


def test_json_union_names_the_specs_of_each_instant(runs: dict[str, Run]) -> None:
    data = _json(runs["json-union"])
    # 01:00 London does not exist on 2026-03-29 (fires at the jump, 01:00Z); 03:00Z is on both specs.
    assert [(d["instant"], d["specs"], d.get("dst")) for d in data] == [
        ("2026-03-29T00:00:00Z", [0, 1], None), ("2026-03-29T01:00:00Z", [0], "gap"),
        ("2026-03-29T01:30:00Z", [1], None), ("2026-03-29T02:00:00Z", [0], None)]
