"""The dispatch plane's load shaping, as a pure function: rates, quotas, pacing of the recovery lanes
and the published shedding order (backfill, catch-up, over-quota, on-time)."""

from __future__ import annotations

import itertools

import pytest

from fireledger.dispatch.lanes import ConfigError, DispatchConfig, LaneConfig, parse_lane
from fireledger.dispatch.shaping import (
    SHEDDING_ORDER,
    Admission,
    Candidate,
    Capacity,
    Rate,
    TenantQuota,
    bucket_keys,
    charge,
    conforms,
    next_conforming,
    shape,
)

S = 1_000_000
NOW = 1_800_000_000 * S
CFG = DispatchConfig()


def cands(tenant: str, lane: str, n: int, trigger: str = "tr") -> list[Candidate]:
    return [Candidate(tenant, trigger, NOW - (n - i) * S, 0, lane) for i in range(n)]


def cap(total: int, over: int = 1000, **lanes: int) -> Capacity:
    per = {"on-time": total, "catch-up": total, "backfill": total}
    per.update({k.replace("_", "-"): v for k, v in lanes.items()})
    return Capacity(total, per, over)


def classes(plan) -> list[str]:
    return [a.value for _, a in plan.admitted]


def test_gcra_rate_and_burst():
    r = Rate(10.0, 1.0)
    assert conforms(0, NOW, r)
    tat = charge(0, NOW, r)
    assert tat == NOW + 100_000 and not conforms(tat, NOW, r)
    assert next_conforming(tat, r) == NOW + 100_000 and conforms(tat, NOW + 100_000, r)
    burst = Rate(10.0, 5.0)
    tat, n = 0, 0
    while conforms(tat, NOW, burst):
        tat, n = charge(tat, NOW, burst), n + 1
    assert n == 5
    # Rounded up: a rate that is not a whole number of µs is never exceeded.
    third = Rate(3.0)
    t = 0
    for _ in range(3):
        t = charge(t, NOW, third)
    assert t >= NOW + S


def test_the_published_shedding_order():
    assert [a.value for a in SHEDDING_ORDER] == ["backfill", "catch-up", "over-quota", "on-time"]


def test_capacity_is_shed_backfill_first_then_catch_up_then_over_quota_then_on_time():
    """As capacity shrinks from enough-for-all to nothing, classes lose their attempts in the
    published order: a class gets anything only when every class above it got everything."""
    quota = {t: TenantQuota(5.0, 1000, 0.5) for t in ("a", "b", "c", "d")}
    offered = {
        "on-time": cands("a", "on-time", 5) + cands("b", "on-time", 8),   # b: 5 in quota, 3 over
        "catch-up": cands("c", "catch-up", 2),
        "backfill": cands("d", "backfill", 2),
    }
    # a and b have spent nothing: 5 of each in quota (burst 1 s), b's other 3 over quota; the
    # recovery lanes are paced (2.5/s, no burst): one attempt each at this instant.
    want_total = {"on-time": 10, "over-quota": 3, "catch-up": 1, "backfill": 1}
    prio = ["on-time", "over-quota", "catch-up", "backfill"]
    for total in range(0, 18):
        plan = shape(NOW, offered, quota, {}, {}, cap(total), CFG)
        got = {k: classes(plan).count(k) for k in prio}
        assert sum(got.values()) == min(total, 15)
        for i, k in enumerate(prio):
            if got[k]:
                assert all(got[h] == want_total[h] for h in prio[:i]), (total, got)
        # Whatever was not admitted is reported as waiting, by class.
        assert sum(plan.waiting.values()) == 17 - sum(got.values())
        if total < 15:
            assert plan.waiting.get(prio[-1], 0) >= 1 or got["backfill"] == 0


def test_in_quota_work_of_every_tenant_goes_before_anyone_s_over_quota_work():
    quota = {"big": TenantQuota(2.0, 1000, 0.1), "small": TenantQuota(100.0, 1000, 0.1)}
    offered = {"on-time": cands("big", "on-time", 10) + cands("small", "on-time", 3)}
    plan = shape(NOW, offered, quota, {}, {}, cap(5), CFG)
    got = [(c.tenant_id, a.value) for c, a in plan.admitted]
    assert got.count(("small", "on-time")) == 3 and got.count(("big", "on-time")) == 2
    assert not [g for g in got if g[1] == "over-quota"]
    plan = shape(NOW, offered, quota, {}, {}, cap(13), CFG)
    assert classes(plan).count("over-quota") == 8


def test_over_quota_work_is_bounded_by_its_slots_and_its_debt():
    quota = {"t": TenantQuota(10.0, 1000, 0.1)}
    offered = {"on-time": cands("t", "on-time", 100)}
    plan = shape(NOW, offered, quota, {}, {}, cap(1000, over=7), CFG)
    assert classes(plan).count("on-time") == 10 and classes(plan).count("over-quota") == 7
    # The debt is capped: at most a burst plus ``over_quota_debt_s`` of quota past now.
    tat = plan.tats["quota:t"]
    assert tat <= NOW + 2 * S
    plan = shape(NOW, offered, quota, {}, {}, cap(1000, over=1000), CFG)
    assert plan.tats["quota:t"] <= NOW + 2 * S


def test_retries_are_charged_to_the_tenant_so_its_new_fires_are_over_quota():
    """A tenant that spent its quota on retries (any attempt charges it) yields to a tenant in quota."""
    quota = {"failing": TenantQuota(5.0, 1000, 0.1), "ok": TenantQuota(5.0, 1000, 0.1)}
    tats: dict[str, int] = {}
    for _ in range(5):   # five retry attempts in the last instant
        tats["quota:failing"] = charge(tats.get("quota:failing", 0), NOW, Rate(5.0, 5.0))
    offered = {"on-time": [Candidate("failing", "x", NOW, 0, "on-time"), Candidate("ok", "y", NOW, 0, "on-time")]}
    plan = shape(NOW, offered, quota, {}, tats, cap(1), CFG)
    assert [(c.tenant_id, a.value) for c, a in plan.admitted] == [("ok", "on-time")]
    plan = shape(NOW, offered, quota, {}, tats, cap(2), CFG)
    assert ("failing", "over-quota") in [(c.tenant_id, a.value) for c, a in plan.admitted]


def test_in_flight_quota_is_hard_for_every_class():
    quota = {"slow": TenantQuota(1000.0, 3, 0.5)}
    offered = {"on-time": cands("slow", "on-time", 10), "catch-up": cands("slow", "catch-up", 10)}
    plan = shape(NOW, offered, quota, {"slow": 1}, {}, cap(100), CFG)
    assert len(plan.admitted) == 2
    assert shape(NOW, offered, quota, {"slow": 3}, {}, cap(100), CFG).admitted == []


@pytest.mark.parametrize("lane", ["catch-up", "backfill"])
def test_recovery_lanes_are_paced_at_the_fraction_of_quota(lane):
    """Simulated over 10 s in 10 ms rounds with unlimited capacity: the drain never exceeds
    ``catchup_fraction × quota`` (strict pacing, no burst) and keeps up with it."""
    quota = {"t": TenantQuota(100.0, 1000, 0.1)}
    backlog = cands("t", lane, 500)
    tats: dict[str, int] = {}
    starts: list[tuple[tuple[str, str, int, int], int]] = []
    done: set[tuple[str, str, int, int]] = set()
    for step in range(1000):
        now = NOW + step * 10_000
        left = [c for c in backlog if c.key not in done][:50]
        plan = shape(now, {lane: left}, quota, {}, tats, cap(1000), CFG)
        tats.update(plan.tats)
        starts += [(c.key, now) for c, _ in plan.admitted]
        done.update(c.key for c, _ in plan.admitted)
        assert all(a.value == lane for _, a in plan.admitted)
        if not plan.admitted:
            assert plan.wake_us is not None and plan.wake_us > now
    times = [t for _, t in starts]
    assert all(b - a >= 100_000 for a, b in itertools.pairwise(times))
    assert 99 <= len(times) <= 101          # 10/s for 10 s


def test_recovery_work_stays_within_the_tenant_quota_too():
    quota = {"t": TenantQuota(1.0, 1000, 1.0)}
    tats = {"quota:t": NOW + 5 * S}         # spent well past its quota
    plan = shape(NOW, {"catch-up": cands("t", "catch-up", 3)}, quota, {}, tats, cap(10), CFG)
    assert plan.admitted == [] and plan.wake_us == NOW + 5 * S


def test_lane_rate_is_global_and_gives_a_wake_time():
    cfg = CFG.with_lane("on-time", rate=2.0)   # burst max(1, 2/10) = 1
    quota = {"t": TenantQuota(1000.0, 1000, 0.1)}
    plan = shape(NOW, {"on-time": cands("t", "on-time", 5)}, quota, {}, {}, cap(10), cfg)
    assert len(plan.admitted) == 1 and plan.wake_us == NOW + S // 2
    assert plan.tats["lane:on-time"] == NOW + S // 2


def test_lane_concurrency_and_total_capacity():
    quota = {"t": TenantQuota(1000.0, 1000, 1.0)}
    offered = {"on-time": cands("t", "on-time", 5), "catch-up": cands("t", "catch-up", 5, "c")}
    plan = shape(NOW, offered, quota, {}, {}, Capacity(10, {"on-time": 2, "catch-up": 1, "backfill": 0}, 10), CFG)
    assert classes(plan) == ["on-time", "on-time", "catch-up"]


def test_round_robin_order_of_the_store_is_kept_within_a_class():
    quota = {t: TenantQuota(1000.0, 1000, 0.1) for t in "abc"}
    offered = {"on-time": [Candidate(t, "x", NOW - i, i, "on-time") for i in range(3) for t in "abc"]}
    plan = shape(NOW, offered, quota, {}, {}, cap(4), CFG)
    assert [c.tenant_id for c, _ in plan.admitted] == ["a", "b", "c", "a"]


def test_bucket_keys_are_sorted_and_complete():
    cfg = CFG.with_lane("on-time", rate=5.0)
    keys = bucket_keys({"on-time": cands("b", "on-time", 1), "catch-up": cands("a", "catch-up", 1)}, cfg)
    assert keys == sorted(keys)
    assert set(keys) == {"lane:on-time", "lane:catch-up", "quota:a", "quota:b", "catch-up:a"}


def test_a_tenant_missing_from_the_quota_table_gets_the_default():
    plan = shape(NOW, {"on-time": cands("ghost", "on-time", 150)}, {}, {}, {}, cap(1000), CFG)
    assert classes(plan).count("on-time") == 100   # default 100/s, burst 1 s, in flight 100


def test_lane_settings_parse_and_refuse_bad_values():
    base = LaneConfig(200.0, 32)
    assert parse_lane("rate=5,concurrency=3", base) == LaneConfig(5.0, 3)
    assert parse_lane("rate=inf", base) == LaneConfig(None, 32)
    for bad in ("rate=0", "rate=x", "concurrency=0", "speed=3", "rate"):
        with pytest.raises(ConfigError):
            parse_lane(bad, base)
    cfg = DispatchConfig.from_env({"FIRELEDGER_LANE_CATCH_UP": "rate=7,concurrency=2",
                                   "FIRELEDGER_DISPATCH_CONCURRENCY": "9"})
    assert cfg.lane("catch-up") == LaneConfig(7.0, 2) and cfg.concurrency == 9
    with pytest.raises(ConfigError, match="FIRELEDGER_LANE_BACKFILL"):
        DispatchConfig.from_env({"FIRELEDGER_LANE_BACKFILL": "rate=-1"})
    with pytest.raises(ConfigError, match="FIRELEDGER_DISPATCH_CONCURRENCY"):
        DispatchConfig.from_env({"FIRELEDGER_DISPATCH_CONCURRENCY": "many"})
    with pytest.raises(ConfigError, match="FIRELEDGER_OVER_QUOTA_SHARE"):
        DispatchConfig.from_env({"FIRELEDGER_OVER_QUOTA_SHARE": "2"})


def test_admission_names_match_the_lanes():
    assert {a.value for a in Admission} == {"on-time", "over-quota", "catch-up", "backfill"}
