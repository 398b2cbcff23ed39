"""The timing loop's gather window (decision 0150): under a stream of instants ``run()`` decides
those due meanwhile together, never before their instant, and no sooner than ``gather_s`` after the
last cycle that committed fires; the window is a setting (``FIRELEDGER_TIMING_GATHER_S``).

Real store (SQLite and PostgreSQL), real clock, ``TimingLoop.run()`` on an event loop. The counts
asserted are bounds the rule implies whatever the machine's speed, not timings.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from fireledger.clock import SystemClock
from fireledger.domain.keys import from_us
from fireledger.domain.pacing import Pacing
from fireledger.recurrence import format_instant
from fireledger.settings import Settings
from fireledger.timing import TimingLoop
from storekit import add_target, add_tenant, add_trigger, run_planes_until

S = 1_000_000
MS = 1_000


def _stream(store, n: int, spacing_us: int) -> tuple[int, int]:
    """``n`` one-shot instants ``spacing_us`` apart, starting 0.4 s from now; (first, last) instant."""
    now = time.time_ns() // 1000
    t = add_tenant(store, now_us=now)
    target = add_target(store, t, now_us=now)
    first = now + 400 * MS
    for i in range(n):
        add_trigger(store, t, target, {"at": format_instant(from_us(first + i * spacing_us))}, now_us=now)
    return first, first + (n - 1) * spacing_us


def _run(store, gather_s: float, n: int) -> tuple[list[tuple[float, int]], list]:
    """Run the loop until ``n`` fires are committed; (start, rows) of each committing cycle, and
    the fires."""
    loop = TimingLoop(store, SystemClock(declared_eps_us=0), "node-g", gather_s=gather_s)
    cycles: list[tuple[float, int]] = []
    fires: list = []
    tick = loop.tick

    def counted():
        started = time.monotonic()
        res = tick()
        if res.claimed_rows:
            cycles.append((started, res.claimed_rows))
            fires.extend(res.inserted)
        return res

    loop.tick = counted
    asyncio.run(run_planes_until([loop], lambda: len(fires) >= n, timeout_s=60))
    return cycles, fires


def test_a_stream_of_instants_is_gathered_into_few_cycles_and_never_early(store):
    n, spacing = 60, 5 * MS                       # 60 instants over 0.3 s
    first, last = _stream(store, n, spacing)
    cycles, fires = _run(store, 0.1, n)
    assert sorted(f.scheduled_us for f in fires) == [first + i * spacing for i in range(n)]
    assert all(f.decided_us >= f.scheduled_us for f in fires)          # invariant 3: never early
    # Each committing cycle starts ≥ 0.1 s after the previous one: a 0.3 s stream fits in at most
    # 0.3 / 0.1 + 1 of them (one per instant without the window: up to 60).
    assert len(cycles) <= 4
    starts = [s for s, _ in cycles]   # measured in the store thread: the hop to it may vary under load
    assert all(b - a >= 0.05 for a, b in itertools.pairwise(starts))


def test_without_the_window_the_loop_still_decides_every_instant(store):
    n, spacing = 20, 10 * MS
    first, _ = _stream(store, n, spacing)
    cycles, fires = _run(store, 0.0, n)
    assert sorted(f.scheduled_us for f in fires) == [first + i * spacing for i in range(n)]
    assert all(f.decided_us >= f.scheduled_us for f in fires)
    assert sum(rows for _, rows in cycles) == n


def test_the_window_and_the_planes_sleeps_are_settings():
    p = Settings.from_env({"FIRELEDGER_TIMING_GATHER_S": "0", "FIRELEDGER_TIMING_MAX_SLEEP_S": "2",
                           "FIRELEDGER_DISPATCH_IDLE_S": "0.25"}).pacing
    assert p == Pacing(timing_gather_s=0.0, timing_max_sleep_s=2.0, dispatch_idle_s=0.25)
    assert Settings.from_env({"FIRELEDGER_DISPATCH_SETTLE_GATHER_S": "0.01"}).pacing.dispatch_settle_gather_s == 0.01
    assert Pacing().dispatch_settle_gather_s == 0.05   # on by default since results ride claims (0253)
    assert Settings.from_env({}).pacing == Pacing()
    assert Pacing().timing_gather_s == 0.02
    for name in ("FIRELEDGER_TIMING_MAX_SLEEP_S", "FIRELEDGER_DISPATCH_IDLE_S"):
        with pytest.raises(ValueError, match=f"^{name}: "):
            Pacing.from_env({name: "0"})             # a zero sleep would spin
    with pytest.raises(ValueError, match=r"^FIRELEDGER_TIMING_GATHER_S: "):
        Pacing.from_env({"FIRELEDGER_TIMING_GATHER_S": "61"})
