"""The timing loop driven by a fake clock on a real store, SQLite and PostgreSQL (the manual scheduler).

Invariants 1 (commit before dispatch), 3 (never early), 4 (shed on a bad clock) and 5 (one next
instant, recomputed from the current version) each have a test here that fails when broken.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import pytest

from fireledger.clock import FakeClock
from fireledger.definitions import next_us
from fireledger.domain.model import TriggerState
from fireledger.recurrence import compile_spec
from fireledger.timing import TimingLoop
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
MS = 1_000


def loop_for(store, clock, handed=None, **kw):
    return TimingLoop(store, clock, "node-a",
                      on_committed=(handed.extend if handed is not None else (lambda fires: None)), **kw)


def test_an_instant_is_not_claimed_until_true_time_passed_it_by_eps(store):
    """Invariant 3: with ε = 50 ms, nothing is claimed until true time ≥ instant + 50 ms."""
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    clock = FakeClock(first + 50 * MS - 1, eps_us=50 * MS)
    loop = loop_for(store, clock)
    assert loop.tick().inserted == []
    clock.advance(1)
    res = loop.tick()
    assert [f.scheduled_us for f in res.inserted] == [first]
    assert res.inserted[0].decided_us >= first            # decided at earliest ≥ scheduled


def test_a_fast_clock_within_its_bound_still_never_fires_early(store):
    """A node whose clock reads ε ahead of true time claims exactly at the instant, not before."""
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    clock = FakeClock(first - 1, eps_us=50 * MS, skew_us=50 * MS)
    loop = loop_for(store, clock)
    assert loop.tick().inserted == []
    clock.advance(1)
    assert [f.scheduled_us for f in loop.tick().inserted] == [first]


def test_a_clock_bound_over_the_ceiling_claims_nothing(store):
    """Invariant 4 (single node): above the ε ceiling the node sheds and says why."""
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    clock = FakeClock(first + 10 * S, eps_us=150 * MS)
    loop = loop_for(store, clock)
    res = loop.tick()
    assert res.inserted == [] and "exceeds the ceiling" in res.shed
    clock.eps_us = 20 * MS
    assert len(loop.tick().inserted) == 1


@contextmanager
def failing_commits(store):
    """Every write transaction fails at its end: its statements run, then the engine's own
    transaction sees the error, rolls back and re-raises it, as a disk or connection failure at
    commit would (the same on both engines)."""
    engine = store.engine
    original = engine.write

    @contextmanager
    def write():
        with original() as conn:
            yield conn
            raise OSError("disk I/O error at commit")

    engine.write = write
    try:
        yield
    finally:
        engine.write = original


def test_a_fire_whose_commit_fails_is_never_handed_to_dispatch(store):
    """Invariant 1: the commit is the only way to dispatch; a failed commit hands nothing over."""
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    handed = []
    clock = FakeClock(first + S)
    loop = loop_for(store, clock, handed)
    with failing_commits(store), pytest.raises(OSError):
        loop.tick()
    assert handed == []
    assert store.dispatch.claim_dispatch("on-time", first + 2 * S, 100, "d", 30 * S) == []
    assert store.history.list_fires(t.id, trig.id) == []
    # Positive control: once commits succeed the same instant is decided and handed over.
    loop.tick()
    assert [f.scheduled_us for f in handed] == [first]
    assert len(store.dispatch.claim_dispatch("on-time", first + 2 * S, 100, "d", 30 * S)) == 1


def test_two_timing_loops_on_one_instant_record_one_fire(store):
    """Invariant 2 end to end in one process: both loops decide; one record exists."""
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    clock = FakeClock(first + S)
    a, b = loop_for(store, clock), TimingLoop(store, clock, "node-b")
    rows = store.timing.due_rows(clock.now().earliest_us, 10)
    da, db = a.plan(rows, clock.now().earliest_us), b.plan(rows, clock.now().earliest_us)
    oa, ob = store.timing.apply_decisions(da), store.timing.apply_decisions(db)
    assert len(oa[0].inserted) == 1 and ob[0].inserted == () and not ob[0].advanced
    assert [f.decided_by for f in store.history.list_fires(t.id, trig.id)] == ["node-a"]


def test_amend_and_pause_change_the_next_instant_at_once(store):
    """Invariant 5: an amendment/pause needs no sweep; the loop follows the current version."""
    t = add_tenant(store)
    trig, v, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    clock = FakeClock(T0 + 10 * S)
    loop = loop_for(store, clock)
    # Amend to every 20 s before the first instant: the due row moves now.
    spec2 = {**v.schedule, "every": "20s"}
    nxt2 = next_us(compile_spec(spec2), T0 + 10 * S)
    v2 = dataclasses.replace(v, version=2, schedule=spec2)
    assert store.registry.amend_trigger(trig, v2, trig.name, nxt2, T0 + 10 * S)
    assert nxt2 == T0 + 20 * S
    clock.set(T0 + 20 * S)
    res = loop.tick()
    assert [(f.scheduled_us, f.version) for f in res.inserted] == [(T0 + 20 * S, 2)]
    assert store.registry.get_trigger(t.id, trig.id).next_us == T0 + 40 * S
    # Pause: nothing is decided however far the clock moves.
    assert store.registry.set_trigger_state(store.registry.get_trigger(t.id, trig.id), TriggerState.PAUSED, None,
                                            T0 + 21 * S)
    clock.set(T0 + 600 * S)
    assert loop.tick().inserted == []


def test_cron_dst_gap_fire_is_decided_at_the_jump_with_tzdata_recorded(store):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"cron": "30 1 * * *", "zone": "Europe/London"},
                                 now_us=1_774_656_000_000_000)  # 2026-03-28T00:00:00Z
    # 2026-03-28 01:30 GMT, then 2026-03-29 01:30 does not exist -> 01:00Z (the jump).
    assert first == 1_774_661_400_000_000
    clock = FakeClock(1_774_746_000_000_000 + S)          # 2026-03-29T01:00:01Z
    loop = loop_for(store, clock)
    res = loop.tick()
    got = sorted(f.scheduled_us for f in res.inserted)
    assert 1_774_746_000_000_000 in got
    from fireledger.recurrence import TZDATA_VERSION
    assert {f.tzdata_version for f in res.inserted} == {TZDATA_VERSION}


def test_sleep_after_a_cycle_claims_an_instant_that_became_due_after_the_cycle_read_the_clock():
    from fireledger.timing.loop import TickResult, sleep_after

    ms = 1000
    # The cycle read the clock at bound E and found nothing; the next instant E+2 ms is due by now
    # (E+3 ms): claim at once, not after the 50 ms back-off (that made light-load fires 50 ms late).
    assert sleep_after(TickResult(claimed_rows=0, earliest_us=T0), T0 + 2 * ms, T0 + 3 * ms, 0.5) == 0.0
    # Due at the cycle's own bound yet not claimed (ownership ran out): back off instead of spinning.
    assert sleep_after(TickResult(claimed_rows=0, earliest_us=T0), T0 - ms, T0 + 3 * ms, 0.5) == 0.05
    # Otherwise: until the next instant, capped.
    assert sleep_after(TickResult(claimed_rows=5, earliest_us=T0), T0 + 20 * ms, T0, 0.5) == 0.02
    assert sleep_after(TickResult(claimed_rows=5, earliest_us=T0), T0 + 20 * 10**6, T0, 0.5) == 0.5
    assert sleep_after(TickResult(claimed_rows=0, earliest_us=T0), None, T0, 0.5) == 0.5
