"""Pause/resume under the missed-fire policy (issue 6, decision 0063).

A pause records a resume point; resume restarts the due row at the first instant after it, so the
timing plane decides the paused gap exactly as after an outage: expired beyond the catch-up horizon,
by the missed-fire policy within it, each non-dispatch with its cause in the history, caught-up fires
in the catch-up lane with their original instant.

Store parts run on both engines (contract style); the API parts drive the real app over a real
SQLite store with a fake clock and the real timing loop (``TimingLoop.tick``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from apikit import Api, us
from fireledger.definitions import next_us, recurrence_of
from fireledger.domain.model import FireKind, FireState, Lane, MissedFirePolicy, Policies, TriggerState
from fireledger.domain.policies import DEFAULT_MISS_THRESHOLD_US, Gap, PlanContext, plan_due, replay_gap
from fireledger.timing import TimingLoop
from fireledger.timing.shadow import compare
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000
M = 60 * S
H = 3600 * S


# --- store contract (SQLite and PostgreSQL) -----------------------------------------------------


def test_pause_records_the_resume_point_and_resume_is_compare_and_set(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, v, first = add_trigger(store, t, tg, {"every": "60s"})
    # Paused before its next instant: the resume point is the pause instant; the due row is gone.
    cur = store.registry.get_trigger(t.id, trig.id)
    before = store.registry.definitions_counter()
    assert store.registry.pause_trigger(cur, first - 10 * S) == first - 10 * S
    assert store.registry.get_trigger(t.id, trig.id).state == TriggerState.PAUSED and store.timing.due_rows(2**62,
                                                                                                            10) == []
    assert store.registry.definitions_counter() == before + 1
    assert store.registry.resume_point(t.id, trig.id) == (True, first - 10 * S)
    # Pausing what is not active writes nothing.
    assert store.registry.pause_trigger(cur, first) is None
    assert store.registry.resume_point(t.id, trig.id) == (True, first - 10 * S)
    paused = store.registry.get_trigger(t.id, trig.id)
    # Resume compare-and-sets on the resume point read, and on the current version.
    assert not store.registry.resume_trigger(paused, first - 11 * S, first, first + 5 * H)
    stale = dataclasses.replace(paused, current_version=7)
    assert not store.registry.resume_trigger(stale, first - 10 * S, first, first + 5 * H)
    assert store.registry.get_trigger(t.id, trig.id).state == TriggerState.PAUSED and store.timing.due_rows(2**62,
                                                                                                            10) == []
    assert store.registry.resume_trigger(paused, first - 10 * S, first, first + 5 * H)
    got = store.registry.get_trigger(t.id, trig.id)
    assert got.state == TriggerState.ACTIVE and got.next_us == first and got.updated_us == first + 5 * H
    assert [(r.next_us, r.version) for r in store.timing.due_rows(2**62, 10)] == [(first, 1)]
    assert store.registry.resume_point(t.id, trig.id) == (False, None)
    assert not store.registry.resume_trigger(got, first - 10 * S, first, first + 6 * H)   # not paused any more
    [row], _ = store.timing.shadow_snapshot(0)
    assert (row.paused_us, row.resumed_us) == (first - 10 * S, first + 5 * H)


def test_an_instant_due_but_undecided_at_the_pause_stays_in_the_gap(store):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    # The due row still holds `first` (due 30 s ago, not decided yet): the point is just before it.
    assert store.registry.pause_trigger(store.registry.get_trigger(t.id, trig.id), first + 30 * S) == first - 1
    paused = store.registry.get_trigger(t.id, trig.id)
    # An exhausted schedule resumes with no row.
    assert store.registry.resume_trigger(paused, first - 1, None, first + H)
    assert store.registry.get_trigger(t.id, trig.id).state == TriggerState.ACTIVE and store.timing.due_rows(2**62,
                                                                                                            10) == []


def test_a_trigger_paused_before_resume_points_existed_resumes_without_one(store):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    assert store.registry.set_trigger_state(store.registry.get_trigger(t.id, trig.id), TriggerState.PAUSED, None,
                                            first - S)
    assert store.registry.resume_point(t.id, trig.id) == (True, None)
    assert store.registry.resume_trigger(store.registry.get_trigger(t.id, trig.id), None, first + H, first + H - S)
    assert store.registry.get_trigger(t.id, trig.id).next_us == first + H


def test_last_gap_fires_are_the_newest_plan_that_missed_instants(store):
    t = add_tenant(store)
    trig, v, first = add_trigger(store, t, add_target(store, t), {"every": "60s"},
                                 policies=Policies(missed_fire=MissedFirePolicy.FIRE_ALL, catchup_horizon_s=600))
    rec = recurrence_of(v)

    def decide(at_us: int) -> list:
        row = store.timing.due_rows(2**62, 10)[0]
        ctx = PlanContext(earliest_us=at_us, decided_by="n1", tzdata_version="2026f")
        d = plan_due(row, lambda u: next_us(rec, u), v.policies, ctx)
        [o] = store.timing.apply_decisions([d])
        assert o.advanced
        return list(d.fires)

    assert store.registry.last_gap_fires(t.id, trig.id) == []
    decide(first)                                # on time: no gap
    assert store.registry.last_gap_fires(t.id, trig.id) == []
    gap1 = decide(first + 30 * M)                # 30 instants: 19 expired, 9 caught up, 2 on time
    decide(first + 31 * M)
    gap2 = decide(first + 200 * M)               # 169 minutes: a range record among the expired
    decide(first + 201 * M)
    assert len(gap1) == 30 and any(f.kind == FireKind.CATCH_UP for f in gap1)
    got = store.registry.last_gap_fires(t.id, trig.id)
    assert [(f.scheduled_us, f.state, f.cause) for f in got] == [
        (f.scheduled_us, f.state.value, f.cause) for f in gap2]
    assert {f.decided_us for f in got} == {first + 200 * M}
    assert any(f.cause and f.cause.startswith("range: ") for f in got)
    # A manual fire decided at the same instant is not part of the plan.
    from fireledger.domain.model import NewFire

    manual = NewFire(t.id, trig.id, first + 200 * M, 1, 1, FireKind.MANUAL, Lane.ON_TIME, FireState.PENDING,
                     first + 200 * M, "2026f", "control")
    assert store.timing.insert_fires([manual])
    assert len(store.registry.last_gap_fires(t.id, trig.id)) == len(gap2)


# --- the API and the timing loop (SQLite, fake clock) ------------------------------------------


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


def oracle(instants: list[int], decided_us: int, policy: str, horizon_us: int,
           threshold_us: int = DEFAULT_MISS_THRESHOLD_US) -> dict[str, int]:
    """What the declared policy says for these instants, decided at ``decided_us`` (written from the
    policy's definition, independently of the planner)."""
    on_time = [u for u in instants if decided_us - u <= threshold_us]
    missed = [u for u in instants if decided_us - u > threshold_us]
    expired = [u for u in missed if decided_us - u > horizon_us]
    within = [u for u in missed if decided_us - u <= horizon_us]
    if policy == "fire-all":
        caught, skipped = len(within), 0
    elif policy == "fire-once-now":
        caught = 1 if within and not on_time else 0
        skipped = len(within) - caught
    else:
        caught, skipped = 0, len(within)
    return {"caught_up": caught, "on_time": len(on_time), "skipped": skipped, "expired": len(expired)}


def recorded(api: Api, tenant_id: str, trigger_id: str, decided_us: int) -> dict[str, int]:
    """Counts of one plan from the ledger (a range record counts its range)."""
    from fireledger.domain.policies import record_weight

    out = {"caught_up": 0, "on_time": 0, "skipped": 0, "expired": 0}
    for f in api.store.history.list_fires(tenant_id, trigger_id, limit=10_000):
        if f.decided_us != decided_us or f.kind not in ("scheduled", "catch-up"):
            continue
        n, _ = record_weight(f.cause)
        key = f.state if f.state in ("skipped", "expired") else ("caught_up" if f.lane == "catch-up" else "on_time")
        out[key] += n
    return out


def instants_between(rec, after_us: int, until_us: int) -> list[int]:
    out, t = [], next_us(rec, after_us)
    while t is not None and t <= until_us:
        out.append(t)
        t = next_us(rec, t)
    return out


def no_divergence(api: Api, tenant_id: str, trigger_id: str) -> None:
    part = api.store.registry.get_trigger(tenant_id, trigger_id).partition
    rows, strays = api.store.timing.shadow_snapshot(part)
    report = compare(part, rows, strays, api.store.timing.partition_count(), node="t", now_us=0)
    assert report.divergent == 0, report.divergences


@pytest.mark.parametrize("policy", ["fire-all", "fire-once-now", "skip"])
def test_a_three_hour_pause_is_decided_like_an_outage(api: Api, policy: str) -> None:
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], {"every": "60s"}, missed_fire_policy=policy, jitter="0s")
    loop = TimingLoop(api.store, api.clock, "node-a")
    for _ in range(3):                                          # three on-time fires
        api.clock.advance(M)
        loop.tick()
    api.clock.advance(25 * S)
    paused_at = api.clock.now().latest_us
    assert s.post(f"/v1/triggers/{t['id']}/pause").status_code == 200
    api.clock.advance(3 * H)
    assert loop.tick().inserted == []                           # nothing fires while paused
    r = s.post(f"/v1/triggers/{t['id']}/resume")
    assert r.status_code == 200, r.text
    rec = recurrence_of(api.store.registry.get_version(t["id"], 1))
    gap = instants_between(rec, paused_at, api.clock.now().earliest_us)
    assert len(gap) == 180
    assert r.json()["next_instant"] == _iso(gap[0])            # the first instant after the pause
    no_divergence(api, tenant_id, t["id"])
    res = loop.tick()
    decided = res.earliest_us
    assert recorded(api, tenant_id, t["id"], decided) == oracle(gap, decided, policy, H)
    no_divergence(api, tenant_id, t["id"])
    # Every instant of the gap has a record (individually or in the range record at the oldest).
    fires = s.get(f"/v1/triggers/{t['id']}/fires", params={"limit": 1000}).json()["items"]
    in_gap = [f for f in fires if gap[0] <= us(f["scheduled_instant"]) <= gap[-1]]
    assert in_gap[0]["scheduled_instant"] == _iso(gap[0])
    # Causes: every non-dispatch says why, readable in the history.
    quiet = s.get(f"/v1/triggers/{t['id']}/fires", params={"state": "expired,skipped", "limit": 1000}).json()
    assert quiet["items"] and all(f["cause"] for f in quiet["items"])
    assert any("catch-up horizon (1h)" in f["cause"] for f in quiet["items"])
    if policy != "fire-all":
        assert any(f["state"] == "skipped" and policy in f["cause"] for f in quiet["items"])
    # Caught-up fires are in the catch-up lane with their original instants.
    caught = [f for f in in_gap if f["lane"] == "catch-up" and f["state"] == "pending"]
    for f in caught:
        assert f["kind"] == "catch-up" and us(f["scheduled_instant"]) in gap
        assert decided - us(f["scheduled_instant"]) > DEFAULT_MISS_THRESHOLD_US
    # After the gap the trigger runs on time again.
    api.clock.advance(M)
    assert [f.lane for f in loop.tick().inserted] == [Lane.ON_TIME]


def test_an_instant_undecided_at_the_pause_is_not_lost(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], {"every": "60s"}, missed_fire_policy="fire-all", jitter="0s")
    first = us(t["next_instant"])
    api.clock.advance(M + 20 * S)          # `first` is due, but the loop has not decided it yet
    s.post(f"/v1/triggers/{t['id']}/pause")
    api.clock.advance(10 * M)
    assert s.post(f"/v1/triggers/{t['id']}/resume").json()["next_instant"] == t["next_instant"]
    res = TimingLoop(api.store, api.clock, "node-a").tick()
    assert [f.scheduled_us for f in res.inserted][0] == first
    assert len(res.inserted) == 11 and {f.state for f in res.inserted} == {FireState.PENDING}


def test_amended_while_paused_the_gap_still_starts_at_the_pause(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], {"cron": "0 * * * *", "zone": "UTC"}, missed_fire_policy="fire-all", jitter="0s")
    paused_at = api.clock.now().latest_us                               # 12:00
    s.post(f"/v1/triggers/{t['id']}/pause")
    api.clock.advance(30 * M)
    r = s.patch(f"/v1/triggers/{t['id']}", json={"schedule": {"cron": "*/15 * * * *", "zone": "UTC"}})
    assert r.status_code == 200 and r.json()["state"] == "paused"
    api.clock.advance(30 * M)                                           # 13:00
    r = s.post(f"/v1/triggers/{t['id']}/resume")
    # The new schedule's first instant after the pause (12:15), not after the amendment (12:45).
    assert r.json()["next_instant"] == "2026-03-27T12:15:00Z"
    no_divergence(api, tenant_id, t["id"])
    res = TimingLoop(api.store, api.clock, "node-a").tick()
    assert [(f.scheduled_us, f.lane, f.version) for f in res.inserted] == [
        (us("2026-03-27T12:15:00Z"), Lane.CATCH_UP, 2), (us("2026-03-27T12:30:00Z"), Lane.CATCH_UP, 2),
        (us("2026-03-27T12:45:00Z"), Lane.CATCH_UP, 2), (us("2026-03-27T13:00:00Z"), Lane.ON_TIME, 2)]
    no_divergence(api, tenant_id, t["id"])
    assert paused_at == us("2026-03-27T12:00:00Z")


def test_a_one_shot_that_fell_in_the_pause_is_decided_not_dropped(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], {"at": "2026-03-27T12:10:00Z"}, missed_fire_policy="skip")
    s.post(f"/v1/triggers/{t['id']}/pause")
    api.clock.advance(20 * M)
    assert s.post(f"/v1/triggers/{t['id']}/resume").json()["next_instant"] == "2026-03-27T12:10:00Z"
    [f] = TimingLoop(api.store, api.clock, "node-a").tick().inserted
    assert (f.state, f.kind, "missed-fire policy is skip" in (f.cause or "")) == (FireState.SKIPPED,
                                                                                   FireKind.CATCH_UP, True)
    assert api.store.timing.due_rows(2**62, 10) == []


def test_the_pause_replays_exactly_what_the_planner_decides(api: Api) -> None:
    """The recorded plan of a resumed gap is plan_due's own decision for that gap (replay_gap)."""
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], {"every": "60s"}, missed_fire_policy="fire-once-now", jitter="0s")
    s.post(f"/v1/triggers/{t['id']}/pause")
    api.clock.advance(5 * H)
    first = us(s.post(f"/v1/triggers/{t['id']}/resume").json()["next_instant"])
    res = TimingLoop(api.store, api.clock, "node-a").tick()
    v = api.store.registry.get_version(t["id"], 1)
    ctx = PlanContext(earliest_us=0, decided_by="node-a", tzdata_version=res.inserted[0].tzdata_version)
    d = replay_gap(Gap(tenant_id, t["id"], 1, first, res.earliest_us), lambda u: next_us(recurrence_of(v), u),
                   v.policies, ctx)
    assert [(f.scheduled_us, f.state, f.lane, f.cause) for f in d.fires] == [
        (f.scheduled_us, f.state, f.lane, f.cause) for f in res.inserted]


def test_the_miss_threshold_is_a_setting_named_when_malformed(api: Api) -> None:
    from fireledger.domain.policies import miss_threshold_from

    assert miss_threshold_from({}) == DEFAULT_MISS_THRESHOLD_US
    assert miss_threshold_from({"FIRELEDGER_MISS_THRESHOLD_S": "2.5"}) == 2_500_000
    for bad in ("0", "-1", "abc", "nan", "inf", "86401"):
        with pytest.raises(ValueError, match="FIRELEDGER_MISS_THRESHOLD_S"):
            miss_threshold_from({"FIRELEDGER_MISS_THRESHOLD_S": bad})
    # The timing loop decides with it: a 10 s pause of a 1 s trigger, threshold 2 s, horizon 5 s.
    _, s = api.tenant("acme")
    t = s.trigger(s.target()["id"], {"every": "1s"}, missed_fire_policy="fire-all", catchup_horizon="5s",
                  jitter="0s")
    s.post(f"/v1/triggers/{t['id']}/pause")
    api.clock.advance(10 * S)
    s.post(f"/v1/triggers/{t['id']}/resume")
    fires = TimingLoop(api.store, api.clock, "node-a", miss_threshold_us=2 * S).tick().inserted
    assert [(f.state.value, f.lane.value) for f in fires] == (
        # lateness 9..6 s: expired; 5..3 s: caught up; 2..0 s: on time
        [("expired", "catch-up")] * 4 + [("pending", "catch-up")] * 3 + [("pending", "on-time")] * 3)


def _iso(u: int) -> str:
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant

    return format_instant(from_us(u))
