"""Partition leases across timing nodes, driven by fake clocks on a real store, SQLite and PostgreSQL
(the manual scheduler): balance, takeover after a node dies, shedding and rejoining, correlated excursions,
routine reassignment, and the margin that stops an owner before another node may take its lease.
The same behaviour runs end to end on PostgreSQL with real processes in falsify/scenarios/timing_*.py."""

from __future__ import annotations

from collections import Counter

import pytest

from fireledger.clock import FakeClock
from fireledger.timing import LeaseManager, LeaseSettings, TimingLoop
from fireledger.timing.leases import quota_for
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
MS = 1_000
SET = LeaseSettings(rotate_after_s=0)            # rotation off unless a test turns it on


@pytest.fixture
def store(store):
    """The engine-parametrised store (tests/conftest.py), its partitions made."""
    store.timing.ensure_partitions()
    return store


def owners(store) -> Counter:
    return Counter(x.owner for x in store.timing.lease_table())


def cycle_all(*mgrs, rounds=3):
    for _ in range(rounds):
        for m in mgrs:
            m.cycle()


def test_quota_is_a_fair_deterministic_split():
    assert [quota_for(n, ["a", "b", "c"], 256) for n in "abc"] == [86, 85, 85]
    assert quota_for("z", ["a", "b"], 256) == 0
    assert sum(quota_for(n, list("abcdefg"), 256) for n in "abcdefg") == 256


def test_a_lone_node_takes_every_partition_and_may_claim_until_its_margin(store):
    clock = FakeClock(T0, eps_us=5 * MS)
    a = LeaseManager(store, clock, "a", SET)
    rep = a.cycle()
    assert rep.held == 256 and rep.quota == 256 and owners(store) == {"a": 256}
    own = a.ownership()
    # Valid until the session could lapse by another clock: session TTL − 2ε − guard after the renewal.
    assert own.valid_until == pytest.approx(clock.monotonic() + 3.0 - 0.010 - 0.5)
    assert own.valid(clock.monotonic()) and own.n == 256
    clock.advance(int(2.48 * S))
    assert own.valid(clock.monotonic())
    clock.advance(int(0.02 * S))
    assert not own.valid(clock.monotonic())       # no renewal: it stops claiming by itself
    a.cycle()
    assert a.ownership().valid(clock.monotonic())


def test_nodes_joining_rebalance_by_handing_over(store):
    clock = FakeClock(T0, eps_us=5 * MS)
    a, b, c = (LeaseManager(store, clock, n, SET) for n in "abc")
    a.cycle()
    b.cycle()                                     # b sees a holding everything: nothing free
    assert owners(store) == {"a": 256}
    a.cycle()                                     # a is over its share: offers 128 to b
    assert sum(1 for x in store.timing.lease_table() if x.handoff_to == "b") == 128
    b.cycle()
    assert owners(store) == {"a": 128, "b": 128}
    cycle_all(c, a, b, c)
    assert sorted(owners(store).values()) == [85, 85, 86]
    causes = {x.takeover_cause for x in store.timing.lease_table() if x.owner in ("b", "c")}
    assert causes == {"released"}
    assert {m.ownership().partitions & n.ownership().partitions == frozenset()
            for m in (a, b, c) for n in (a, b, c) if m is not n} == {True}


def test_a_dead_nodes_partitions_are_taken_after_its_session_expires(store):
    clock = FakeClock(T0, eps_us=5 * MS)
    a, b, c = (LeaseManager(store, clock, n, SET) for n in "abc")
    cycle_all(a, b, c, rounds=4)
    dead = set(c.ownership().partitions)
    assert len(dead) == 85
    clock.advance(int(2.9 * S))                   # c stops renewing (kill -9)
    cycle_all(a, b, rounds=1)
    assert owners(store)["c"] == 85               # its session has not expired yet
    clock.advance(int(0.2 * S))
    cycle_all(a, b, rounds=2)
    assert owners(store) == {"a": 128, "b": 128}
    taken = [x for x in store.timing.lease_table() if x.partition in dead]
    assert {x.takeover_cause for x in taken} == {"session-lost"}
    assert all(3.0 * S <= x.takeover_us <= 3.2 * S for x in taken)
    # c's own view ran out before anyone could take over: it could not have claimed meanwhile.
    assert not c.ownership().valid(clock.monotonic())


def test_a_node_whose_clock_is_too_uncertain_sheds_and_rejoins_when_healthy(store):
    clock = FakeClock(T0, eps_us=5 * MS)
    bad_clock = FakeClock(T0, eps_us=5 * MS)
    a = LeaseManager(store, clock, "a", SET)
    b = LeaseManager(store, bad_clock, "b", SET)
    cycle_all(a, b)
    assert owners(store) == {"a": 128, "b": 128}
    bad_clock.eps_us = 150 * MS                   # ε pushed past the 100 ms ceiling
    rep = b.cycle()
    assert rep.shedding and b.ownership().partitions == frozenset()
    assert owners(store) == {"a": 128, None: 128}
    [sb] = [s for s in store.timing.sessions() if s.id == "b"]
    assert sb.shedding and sb.eps_us == 150 * MS  # still heartbeating: it serves reads and metrics
    a.cycle()
    assert owners(store) == {"a": 256}            # the released partitions are owned elsewhere at once
    bad_clock.eps_us = 5 * MS
    for _ in range(5):                            # healthy, but not yet for rejoin_after_s
        clock.advance(500 * MS)
        bad_clock.advance(500 * MS)
        cycle_all(a, b, rounds=1)
    assert b.shedding and owners(store) == {"a": 256}
    for _ in range(4):
        clock.advance(500 * MS)
        bad_clock.advance(500 * MS)
        cycle_all(a, b, rounds=1)
    assert not b.shedding and owners(store) == {"a": 128, "b": 128}


def test_most_nodes_shedding_at_once_is_reported_as_a_correlated_excursion(store):
    clocks = [FakeClock(T0, eps_us=5 * MS) for _ in range(3)]
    mgrs = [LeaseManager(store, c, n, SET) for c, n in zip(clocks, "abc", strict=True)]
    cycle_all(*mgrs)
    clocks[0].eps_us = clocks[1].eps_us = 200 * MS
    cycle_all(*mgrs, rounds=1)
    assert mgrs[2].last.correlated_excursion
    assert owners(store) == {"c": 256}            # the last healthy node carries every partition


def test_routine_reassignment_moves_every_partition_within_its_period(store):
    clock = FakeClock(T0, eps_us=5 * MS)
    st = LeaseSettings(rotate_after_s=20, rotate_batch=8)
    mgrs = [LeaseManager(store, clock, n, st) for n in "abc"]
    cycle_all(*mgrs, rounds=4)
    first = {x.partition: (x.owner, x.epoch) for x in store.timing.lease_table()}
    for _ in range(int(32 / 0.5)):                # 1.5 × rotate_after plus slack, one cycle per 0.5 s
        clock.advance(500 * MS)
        cycle_all(*mgrs, rounds=1)
    now = {x.partition: (x.owner, x.epoch) for x in store.timing.lease_table()}
    assert all(now[p][1] > first[p][1] for p in first), "a partition was never reassigned"
    assert sorted(owners(store).values()) == [85, 85, 86]
    assert all(x.takeover_cause == "released" and x.takeover_us < 600 * MS for x in store.timing.lease_table())


def test_the_loop_claims_only_rows_of_partitions_it_holds(store):
    clock = FakeClock(T0 + 59 * S, eps_us=5 * MS)
    t = add_tenant(store)
    tg = add_target(store, t)
    trig = {p: add_trigger(store, t, tg, {"every": "60s"}, partition=p) for p in range(4)}   # due at T0 + 60 s
    a = LeaseManager(store, clock, "a", SET)
    b = LeaseManager(store, clock, "b", SET)
    cycle_all(a, b)
    la, lb = TimingLoop(store, clock, "a", leases=a), TimingLoop(store, clock, "b", leases=b)
    clock.set(T0 + 60 * S + 10 * MS)
    ra, rb = la.tick(), lb.tick()
    got_a = {f.trigger_id for f in ra.inserted}
    got_b = {f.trigger_id for f in rb.inserted}
    assert got_a.isdisjoint(got_b) and len(got_a | got_b) == 4
    assert got_a == {trig[p][0].id for p in range(4) if p in a.ownership().partitions}
    assert ra.partitions == len(a.ownership().partitions)
    # Ownership that ran out (no renewal) claims nothing.
    clock.set(T0 + 130 * S)
    assert la.tick().inserted == [] and lb.tick().inserted == []


def test_a_partition_released_between_plan_and_commit_is_not_committed(store):
    clock = FakeClock(T0 + 59 * S, eps_us=5 * MS)
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, _, first = add_trigger(store, t, tg, {"every": "60s"}, partition=5)
    a = LeaseManager(store, clock, "a", SET)
    a.cycle()
    loop = TimingLoop(store, clock, "a", leases=a)
    plan = loop.plan_batch

    def plan_then_lose(rows, earliest, **kw):
        out = plan(rows, earliest, **kw)
        a._drop({5})                              # a release lands while the batch is planned
        return out

    loop.plan_batch = plan_then_lose
    clock.set(first + 10 * MS)
    res = loop.tick()
    assert res.dropped == 1 and res.inserted == []
    assert store.history.list_fires(t.id, trig.id) == []


def test_settings_come_from_the_environment_and_bad_values_are_named():
    s = LeaseSettings.from_env({"FIRELEDGER_SESSION_TTL_S": "4", "FIRELEDGER_ROTATE_BATCH": "3"})
    assert s.session_ttl_s == 4.0 and s.rotate_batch == 3 and s.lease_ttl_s == 15.0
    with pytest.raises(ValueError, match="FIRELEDGER_LEASE_TTL_S"):
        LeaseSettings.from_env({"FIRELEDGER_LEASE_TTL_S": "soon"})
    with pytest.raises(ValueError, match="FIRELEDGER_SESSION_TTL_S"):
        LeaseSettings.from_env({"FIRELEDGER_SESSION_TTL_S": "0.6"})
