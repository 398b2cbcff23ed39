"""When the timing loop runs its cycles (decisions 0227–0229): on its own thread, woken once per
cycle; the gather window floored on a cycle's *planned* start, so a late wake-up is not carried into
the next window; the held fires read only when one can be there to release.

Real stores (SQLite, and both engines where the store is read), the real clock for ``run()``, the
fake clock for ``tick()``. Timed assertions are bounds the rule implies with wide margins.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from pathlib import Path

import pytest

from fireledger.clock import FakeClock, SystemClock
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import FireState, NewFire, OverlapPolicy, Policies
from fireledger.recurrence import format_instant
from fireledger.store import Store
from fireledger.timing import TimingLoop
from fireledger.timing.pace import HELD_RESCAN_S, HeldScan, gather_floor
from storekit import add_target, add_tenant, add_trigger, run_planes_until

S = 1_000_000
MS = 1_000


# --- the pure rules -------------------------------------------------------------------------------


def test_the_gather_floor_starts_from_the_planned_start_not_a_late_wake_up():
    g = 0.02
    assert gather_floor(started=10.003, planned=10.0, gather_s=g) == pytest.approx(10.02)   # woke 3 ms late
    assert gather_floor(started=10.0, planned=10.005, gather_s=g) == pytest.approx(10.02)   # woken early
    # Woken far later than planned: no spin of small cycles, the next is still ≥ g/2 after this one.
    assert gather_floor(started=10.5, planned=10.0, gather_s=g) == pytest.approx(10.51)


def test_held_fires_are_read_when_one_can_be_there():
    scan = HeldScan(every_s=1.0)
    assert scan.due(0.0, None)                      # the first cycle reads them
    scan.read(0.0, None, found=False)
    assert not scan.due(0.5, None)                  # none seen, nothing committed held, same partitions
    assert scan.due(1.0, None)                      # … but at least every second
    scan.read(1.0, frozenset({1, 2}), found=False)
    assert scan.due(1.1, frozenset({1, 2, 3}))      # a partition taken over: its former owner's held fires
    scan.read(1.1, frozenset({1, 2, 3}), found=True)
    assert scan.due(1.2, frozenset({1, 2, 3}))      # held fires waiting: read every cycle
    scan.read(1.2, frozenset({1, 2, 3}), found=False)
    scan.committed_held()
    assert scan.due(1.3, frozenset({1, 2, 3}))      # this loop committed a held fire


# --- the held-fire read on a real store (both engines) --------------------------------------------


def _count_held_reads(store) -> list[int]:
    """Count the loop's reads of the held fires (the store method wrapped, the store untouched)."""
    calls = [0]
    real = store.timing.held_fires

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    store.timing.held_fires = counted
    return calls


def test_a_stream_without_queue_triggers_reads_the_held_fires_once_a_second(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    _trig, _, first = add_trigger(store, t, tg, {"every": "1s"})
    clock = FakeClock(first)
    loop = TimingLoop(store, clock, "node-a")
    reads = _count_held_reads(store)
    decided = 0
    for _ in range(10):                      # ten cycles over 0.9 s, one fire decided
        decided += len(loop.tick().inserted)
        clock.advance(100 * MS)
    assert decided == 1
    assert reads[0] == 1                     # the first cycle only
    clock.set(first + S + 50 * MS)
    assert len(loop.tick().inserted) == 1    # a second later: read again, and the next instant decided
    assert reads[0] == 2


def test_a_held_fire_committed_by_another_node_is_released_within_the_rescan_period(store):
    """Leases off (two nodes claim every partition): node A commits a held fire after node B's last
    read found none; B releases it once its previous fire has finished, at most ``HELD_RESCAN_S``
    later — and a held fire B commits itself is looked at by B's very next cycle."""
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, _, first = add_trigger(store, t, tg, {"every": "10s"},
                                 policies=Policies(overlap=OverlapPolicy.QUEUE, outcome_window_s=30))
    clock = FakeClock(first)
    handed: list[NewFire] = []
    a = TimingLoop(store, clock, "node-a")
    b = TimingLoop(store, clock, "node-b", on_committed=handed.extend)
    assert [f.state for f in a.tick().inserted] == [FireState.PENDING]
    [job0] = store.dispatch.claim_dispatch("on-time", first + 100 * MS, 10, "d1", 60 * S)
    read_at = first + 10 * S - MS
    clock.set(read_at)
    assert b.tick().inserted == []            # B reads the held fires just before the instant: none
    clock.set(first + 10 * S)
    [held] = a.tick().inserted                # A decides the instant: held (the previous is running)
    assert held.state == FireState.HELD and held.decided_us >= held.scheduled_us
    assert store.dispatch.settle_attempts([Settlement(job0, "delivered", None, None, "delivered", None, None)],
                                          first + 10 * S + 1) == [True]
    store.dispatch.record_outcome(FireKey(trig.tenant_id, trig.id, first, 0), "succeeded", first + 10 * S + 2,
                                  target_id=tg.id, msg_id="msg_1", replay_window_us=300 * S)
    clock.set(read_at + 500 * MS)
    assert b.tick().released == []           # inside B's rescan period: not looked at yet
    clock.set(read_at + int(HELD_RESCAN_S * S))
    assert [f.scheduled_us for f in b.tick().released] == [first + 10 * S]
    assert handed[-1].scheduled_us == first + 10 * S and handed[-1].state == FireState.PENDING
    # B now decides the next instant itself while that fire runs: held, and its next cycle reads it.
    assert len(store.dispatch.claim_dispatch("on-time", first + 11 * S, 10, "d1", 60 * S)) == 1
    clock.set(first + 20 * S)
    [own] = b.tick().inserted
    assert own.state == FireState.HELD
    assert b.held_scan.due(clock.monotonic(), None)


# --- run(): its own thread, the floor, wake-ups, stop ---------------------------------------------


def _sqlite(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path / 'pace.db'}", migrate=True)


def _one_shots(store, n: int, spacing_us: int, lead_us: int = 400 * MS) -> list[int]:
    now = time.time_ns() // 1000
    t = add_tenant(store, now_us=now)
    target = add_target(store, t, now_us=now)
    instants = [now + lead_us + i * spacing_us for i in range(n)]
    for at in instants:
        add_trigger(store, t, target, {"at": format_instant(from_us(at))}, now_us=now)
    return instants


def test_a_late_wake_up_is_not_carried_into_the_next_gather_window(tmp_path):
    """Instants exactly one gather window apart, on a machine that wakes the loop 25 ms late every
    time: each fire is ≈25 ms late, not 25 ms later than the one before (with the floor on the
    actual start the lateness climbed by the wake-up delay at every instant, up to the window)."""
    store = _sqlite(tmp_path)
    try:
        n, spacing = 12, 100 * MS
        instants = _one_shots(store, n, spacing)
        loop = TimingLoop(store, SystemClock(declared_eps_us=0), "node-p", gather_s=0.1)
        real_wait = loop._wake.wait

        def late_wait(timeout: float | None = None) -> bool:
            woken = real_wait(timeout)
            if not woken:
                time.sleep(0.025)   # the machine's late wake-up being modelled, not a wait for a condition
            return woken

        loop._wake.wait = late_wait  # type: ignore[method-assign]
        fires: list[NewFire] = []
        loop.on_committed = fires.extend
        asyncio.run(run_planes_until([loop], lambda: len(fires) >= n, timeout_s=60))
        assert sorted(f.scheduled_us for f in fires) == instants
        late = [f.decided_us - f.scheduled_us for f in fires]
        assert min(late) >= 0                                   # invariant 3: never early
        assert statistics.median(late) < 50 * MS                # climbing by 25 ms an instant: ≥ 60 ms
    finally:
        store.close()


def test_run_cycles_on_its_own_thread_and_wakes_stops_and_cancels_promptly(tmp_path):
    store = _sqlite(tmp_path)
    try:
        loop = TimingLoop(store, SystemClock(declared_eps_us=0), "node-w", max_sleep_s=30.0)
        threads: set[str] = set()
        tick = loop.tick

        def named_tick():
            threads.add(threading.current_thread().name)
            return tick()

        loop.tick = named_tick  # type: ignore[method-assign]
        fires: list[NewFire] = []
        loop.on_committed = fires.extend

        async def scenario() -> float:
            task = asyncio.create_task(loop.run())
            deadline = time.monotonic() + 10
            while not threads and time.monotonic() < deadline:   # the first cycle ran: now idle for 30 s
                await asyncio.sleep(0.01)
            _one_shots(store, 1, 0, lead_us=50 * MS)             # a definition due soon, made elsewhere
            threading.Thread(target=loop.wake_threadsafe).start()   # … and its notification
            while not fires and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            task.cancel()                                       # cancelled: the thread is stopped and joined
            with pytest.raises(asyncio.CancelledError):
                await task
            return time.monotonic() - t0

        stop_s = asyncio.run(scenario())
        assert len(fires) == 1 and fires[0].decided_us >= fires[0].scheduled_us
        assert all(name.startswith("timing-store") for name in threads)
        assert stop_s < 5.0                                     # not the 30 s sleep
        assert not any(th.name.startswith("timing-store") and th.is_alive() for th in threading.enumerate())
    finally:
        store.close()
