"""The pure rules of lane due ages, the page, declared drains and the duplicate rate
(``fireledger.domain.lane_records``; decisions 0165–0167)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fireledger.domain.lane_records import (
    MAX_DRAIN_S,
    PAGE_THRESHOLD_S,
    DeliveryCounts,
    Drain,
    age_s,
    page_due_age_s,
    page_firing,
    parse_duration_s,
    per_million,
    validate_reason,
)

S = 1_000_000
NOW = 1_800_000_000 * S
instants = st.integers(min_value=NOW - 10**12, max_value=NOW + 10**12)


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400),
                                                (" 7d ", 7 * 86400)])
def test_durations_parse(text: str, seconds: int) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize(("text", "problem"), [("", "whole number"), ("2", "whole number"), ("1.5h", "whole number"),
                                               ("-1h", "whole number"), ("0s", "longer than 0s"),
                                               ("8d", "at most 7d"), ("2w", "whole number")])
def test_bad_durations_name_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_duration_s(text)
    assert MAX_DRAIN_S == 7 * 86400


def test_reasons_are_one_printable_line() -> None:
    assert validate_reason("  planned failover  ") == "planned failover"
    for bad in ("", "   ", "two\nlines", "x" * 501):
        with pytest.raises(ValueError):
            validate_reason(bad)


def test_the_rate_is_per_million_delivered_fires_and_absent_without_fires() -> None:
    assert per_million(3, 1_000_000) == 3.0
    assert per_million(1, 3) == pytest.approx(333_333.33, rel=1e-6)
    assert per_million(0, 0) is None
    c = DeliveryCounts(2_000_000, 5, 12)
    assert (c.duplicates_per_million, c.possible_per_million) == (2.5, 6.0)
    with pytest.raises(ValueError):
        per_million(-1, 10)


@given(instants, st.one_of(st.none(), instants), st.dictionaries(st.sampled_from(["on-time", "catch-up", "backfill"]),
                                                                 instants))
def test_the_page_looks_only_at_undecided_rows_and_the_on_time_lane(now: int, undecided: int | None,
                                                                    lanes: dict[str, int]) -> None:
    page = page_due_age_s(now, undecided, lanes)
    assert page == max(age_s(now, undecided), age_s(now, lanes.get("on-time")))
    # However old the recovery lanes are, they move nothing.
    recovery_old = {**lanes, "catch-up": now - 10**12, "backfill": now - 10**12}
    assert page_due_age_s(now, undecided, recovery_old) == page
    assert page >= 0


@given(st.floats(min_value=0, max_value=1e6), instants, st.integers(min_value=1, max_value=10**10))
def test_a_drain_in_force_suppresses_the_page_and_an_expired_or_stopped_one_does_not(age: float, start: int,
                                                                                    length: int) -> None:
    over = age > PAGE_THRESHOLD_S
    d = Drain("dr_1", start, start + length, "maintenance", "operator")
    assert page_firing(age, None, start) is over
    assert page_firing(age, d, start) is False                      # in force from its start
    assert page_firing(age, d, start + length - 1) is False
    assert page_firing(age, d, start + length) is over              # expired by itself
    stopped = Drain("dr_1", start, start + length, "maintenance", "operator", start, "operator")
    assert page_firing(age, stopped, start) is over
    assert page_firing(age, d, start - 1) is over                   # not yet started


def test_a_drain_reads_back_its_remaining_time() -> None:
    d = Drain("dr_1", NOW, NOW + 3600 * S, "maintenance", "operator")
    view = d.as_json(NOW + 600 * S)
    assert view["in_force"] is True and view["remaining_s"] == 3000.0
    assert d.as_json(NOW + 3600 * S)["remaining_s"] == 0.0


def test_the_shipped_page_threshold_is_the_one_drain_status_evaluates() -> None:
    import re
    from pathlib import Path

    rules = (Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml").read_text()
    m = re.search(r"alert: FireledgerDueAgeHigh\n\s+expr: .*\) > (\d+) unless", rules)
    assert m is not None and float(m.group(1)) == PAGE_THRESHOLD_S
