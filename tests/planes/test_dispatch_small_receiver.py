"""The dispatch plane against the standard library's HTTP server with its default accept backlog (5),
on both stores (issue 15): 300 fires due at once through the real dispatcher are all delivered, none
``unknown``, and the receiver never had to hold more connections than the origin's adaptive limit
allows (the limit is the tenant's, per endpoint: decision 0133). Real SQLite/PostgreSQL, real timing loop, real HTTP."""

from __future__ import annotations

import asyncio
import time

from fireledger.clock import FakeClock
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.model import Policies
from fireledger.timing import TimingLoop
from smallrx import SmallReceiver
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000
N = 300


def test_300_fires_due_at_once_reach_a_backlog_of_5_receiver_none_unknown(store) -> None:
    rx = SmallReceiver().start()
    try:
        start = int(time.time()) * S
        clock = FakeClock(start)
        t = add_tenant(store, now_us=start)
        tg = add_target(store, t, url=f"{rx.base_url}/hook", now_us=start)
        triggers = [add_trigger(store, t, tg, {"every": "3600s"}, now_us=start,
                                policies=Policies(max_attempts=3))[0] for _ in range(N)]
        clock.set(start + 3600 * S + S // 10)
        assert len(TimingLoop(store, clock, "t1").tick().inserted) == N   # all due at one instant

        async def drain() -> tuple[int, float | None]:
            async with Dispatcher(store, clock, "d1") as d:
                deadline = time.monotonic() + 60
                while d.delivered < N and time.monotonic() < deadline:
                    await d.claim_once()
                    await d.flush()
                    clock.advance(S // 10)   # retries (if any) become due
                assert d.sender is not None
                return d.delivered, d.sender.origin_limit(f"{rx.base_url}/hook", t.id)

        started = time.monotonic()
        delivered, limit = asyncio.run(drain())
        elapsed = time.monotonic() - started
    finally:
        rx.stop()
    assert delivered == N
    fires = [f for trig in triggers for f in store.history.list_fires(t.id, trig.id)]
    assert sorted({f.state for f in fires}) == ["delivered"]
    results = [a.result for f in fires for a in f.attempt_list]
    assert "unknown" not in results, results
    assert len({d["fire_key"] for d in rx.delivered()}) == N
    assert limit is not None and limit <= 64
    assert rx.max_open <= 64, rx.max_open                      # the sender's cap per origin, never more
    assert elapsed < 30, f"{elapsed:.1f}s: attempts waited out a timeout"
