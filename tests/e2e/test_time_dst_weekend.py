"""``time-dst-weekend`` quick form (falsify/scenarios/time_dst_weekend.py): real ``fireledger serve``
processes under one accelerated libfaketime clock fire triggers in three zones across DST
transitions; every delivery is checked against ``fireledger preview`` of the same schedule."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from falsify.run import run_one
from falsify.scenarios.time_dst_weekend import QUICK_SEGMENTS, YEAR, ZONES, chosen, run, transitions

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def quick() -> dict[str, Any]:
    return run_one("time-dst-weekend", lambda: run(True))


def test_transitions_are_where_zoneinfo_puts_them():
    """Two changes a year per zone, each a real offset change at the minute found; the passes pair
    the northern spring gaps with Lord Howe's autumn fold and the other way round."""
    for zone in ZONES:
        ts = transitions(zone, YEAR)
        assert len(ts) == 2, (zone, ts)
        for t in ts:
            tz = ZoneInfo(zone)
            before = (t.at - timedelta(minutes=1)).astimezone(tz).utcoffset()
            assert before is not None and before.total_seconds() == t.before_s != t.after_s
            assert t.at.astimezone(tz).utcoffset().total_seconds() == t.after_s  # type: ignore[union-attr]
    kinds = {(p, t.zone): t.kind for p, ts in chosen(YEAR).items() for t in ts}
    assert kinds[("spring", "America/New_York")] == kinds[("spring", "Europe/London")] == "gap"
    assert kinds[("spring", "Australia/Lord_Howe")] == "fold"
    assert kinds[("autumn", "Australia/Lord_Howe")] == "gap"
    assert kinds[("autumn", "America/New_York")] == kinds[("autumn", "Europe/London")] == "fold"


def test_every_instant_once_never_early_gaps_at_the_jump_folds_once_labelled(quick):
    assert quick["passed"], quick
    segs = quick["segments"]
    assert [(s["pass"], s["transition"].split()[0]) for s in segs] == list(QUICK_SEGMENTS)
    for s in segs:
        assert s["instants"] > 0 and s["missing_records"] == s["unexpected_records"] == 0, s
        assert s["duplicate_records"] == s["undelivered"] == 0, s
        assert s["early_arrivals"] == s["early_decisions"] == s["early_dispatches"] == 0, s
        assert s["gap_not_at_jump"] == s["fold_not_first"] == 0, s
        # every fire from a gap or a fold carries the compiler's label (decision 0160), no other does
        assert s["dst_label_wrong"] == s["dst_label_unexpected"] == 0, s
        assert s["dst_labelled_fires"] == s["gap_instants"] + s["fold_instants"], s
        kind = "gap_instants" if "(gap" in s["transition"] else "fold_instants"
        assert s[kind] > 0, s       # the transition night's wall times were exercised
    assert quick["triggers"] == 60
    assert quick["dst_labelled_fires"] == quick["gap_instants"] + quick["fold_instants"] > 0
    assert quick["lateness_faked_s"]["p50"] is not None and quick["lateness_faked_s"]["p50"] >= 0
    assert quick["lateness_real_s"]["max"] == pytest.approx(quick["lateness_faked_s"]["max"] / quick["rate"], abs=1e-3)
