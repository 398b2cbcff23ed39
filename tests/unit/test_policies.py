"""The pure missed-fire planner: counts are exactly what the policy and horizon declare."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fireledger.domain.model import DueRow, FireState, Lane, MissedFirePolicy, Policies
from fireledger.domain.policies import PlanContext, plan_due

M = 60_000_000
T0 = 1_800_000_000_000_000


def every_minute(after: int) -> int:
    return (after // M + 1) * M


def run(policy, gap_minutes, horizon_s=3600, cap=10_000):
    first = every_minute(T0)
    row = DueRow("tr_1", "tn_1", 0, first, 1)
    earliest = first + gap_minutes * M
    ctx = PlanContext(earliest_us=earliest, decided_by="n", tzdata_version="2026f", record_cap=cap)
    d = plan_due(row, every_minute, Policies(missed_fire=policy, catchup_horizon_s=horizon_s), ctx)
    by = {}
    for f in d.fires:
        by.setdefault(f.state, []).append(f)
    return d, by, first, earliest


@pytest.mark.parametrize(("policy", "pending", "skipped", "expired"), [
    # 3 h gap: instants first..first+180 min (181). Lateness ≤ 60 s is on time (the last two),
    # 61 s..1 h is missed within the horizon (59), older than 1 h is expired (120).
    (MissedFirePolicy.FIRE_ALL, 2 + 59, 0, 120),
    (MissedFirePolicy.FIRE_ONCE_NOW, 2, 59, 120),
    (MissedFirePolicy.SKIP, 2, 59, 120),
])
def test_three_hour_gap_under_each_policy(policy, pending, skipped, expired):
    d, by, first, earliest = run(policy, 180)
    assert len(by.get(FireState.PENDING, [])) == pending
    assert len(by.get(FireState.SKIPPED, [])) == skipped
    assert len(by.get(FireState.EXPIRED, [])) == expired
    assert d.advance.new_next_us == earliest + M
    for f in by.get(FireState.EXPIRED, []):
        assert earliest - f.scheduled_us > 3600 * 1_000_000 and "catch-up horizon (1h)" in f.cause
    on_time = [f for f in by[FireState.PENDING] if f.lane == Lane.ON_TIME]
    assert [f.scheduled_us for f in on_time] == [earliest - M, earliest]


def test_fire_once_now_fires_the_most_recent_missed_when_none_is_on_time():
    first = every_minute(T0)
    row = DueRow("tr_1", "tn_1", 0, first, 1)
    earliest = first + 30 * M + M // 2          # 30.5 min: the last instant is 30 s late (not missed)
    ctx = PlanContext(earliest_us=earliest, decided_by="n", tzdata_version="x", miss_threshold_us=10_000_000)
    d = plan_due(row, every_minute, Policies(), ctx)
    pending = [f for f in d.fires if f.state == FireState.PENDING]
    assert [(f.scheduled_us, f.lane) for f in pending] == [(first + 30 * M, Lane.CATCH_UP)]
    assert pending[0].scheduled_us < earliest               # keeps its original instant


def test_a_long_gap_stays_bounded_with_a_range_record():
    d, by, first, earliest = run(MissedFirePolicy.FIRE_ALL, 30 * 24 * 60, cap=100)  # 30 days
    expired = by[FireState.EXPIRED]
    assert len(expired) <= 100
    assert any(f.cause.startswith("range: more than") for f in expired)
    assert len(by[FireState.PENDING]) == 61                  # 59 within the horizon + 2 on time
    assert d.advance.new_next_us == earliest + M


@settings(max_examples=200, deadline=None)
@given(gap=st.integers(0, 600), horizon_min=st.integers(1, 1440),
       policy=st.sampled_from(list(MissedFirePolicy)))
def test_every_instant_is_accounted_for_once_and_nothing_old_is_dispatched(gap, horizon_min, policy):
    d, by, first, earliest = run(policy, gap, horizon_s=horizon_min * 60)
    instants = [f.scheduled_us for f in d.fires]
    assert instants == sorted(set(instants))
    assert instants == list(range(first, earliest + 1, M))
    for f in by.get(FireState.PENDING, []):
        assert earliest - f.scheduled_us <= horizon_min * M or f.lane == Lane.ON_TIME
    for f in d.fires:
        assert f.scheduled_us <= earliest                      # never early
        assert (f.state == FireState.PENDING) == (f.cause is None)


def test_smeared_on_time_fires_keep_their_instant_and_dispatch_later():
    first = every_minute(T0)
    row = DueRow("tr_smear", "tn_1", 0, first, 1)
    ctx = PlanContext(earliest_us=first + 1, decided_by="n", tzdata_version="x")
    d = plan_due(row, every_minute, Policies(jitter_s=30), ctx)
    [f] = [f for f in d.fires if f.state == FireState.PENDING]
    assert f.scheduled_us == first                              # identity unchanged
    assert first <= f.not_before_us < first + 30_000_000        # dispatched within the window
    opted_out = plan_due(row, every_minute, Policies(jitter_s=0), ctx)
    assert [x.not_before_us for x in opted_out.fires] == [None]


@settings(max_examples=300, deadline=None)
@given(lateness_us=st.integers(0, 3 * 3600 * 1_000_000), period_s=st.sampled_from([1, 7, 30, 60, 90, 3600]),
       jitter_s=st.sampled_from([0, 10, 59]), whole_minute=st.booleans(),
       policy=st.sampled_from(list(MissedFirePolicy)), horizon_s=st.sampled_from([60, 3600, 86400]),
       one_shot=st.booleans())
def test_on_time_shortcut_decides_exactly_as_the_general_planner(lateness_us, period_s, jitter_s, whole_minute,
                                                                 policy, horizon_s, one_shot):
    """plan_due's one-instant-on-time shortcut must equal the general loop on every input."""
    from fireledger.domain.policies import plan_general

    period = period_s * 1_000_000
    first = (T0 // M) * M + (0 if whole_minute else 1_000_000)

    def nxt(after: int) -> int | None:
        if one_shot:
            return None if after >= first else first
        return first + ((after - first) // period + 1) * period

    row = DueRow("tr_prop", "tn_1", 0, first, 3)
    pol = Policies(missed_fire=policy, catchup_horizon_s=horizon_s, jitter_s=jitter_s)
    ctx = PlanContext(earliest_us=first + lateness_us, decided_by="n", tzdata_version="2026f")
    assert plan_due(row, nxt, pol, ctx) == plan_general(row, nxt, pol, ctx)
