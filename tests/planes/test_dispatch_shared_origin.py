"""A silent endpoint must not stall a healthy one on the same host (invariant 15, decision 0133).

Both endpoints are served by one real HTTP sink on one loopback port — one origin, as a shared SaaS
receiver (or the falsification sink serving several tenants) is. The silent endpoint's attempts
are written and then never answered; they hold their connections until their timeout. The healthy
endpoint's fires, due while those hang, must be delivered at once: the dispatch pool keeps its
connection slots and adaptive limits per flow (tenant, origin, path), so the silent flow's hung
requests hold only the silent flow's slots. With the limit per origin alone (the pool before
decision 0133), the healthy requests wait behind the hung ones until their timeout (seconds).

Real SQLite/PostgreSQL, real timing loop and dispatcher, real HTTP.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from fireledger.clock import FakeClock
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Policies
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000
SILENT = 6        # more than a flow's initial limit (4): the silent flow is at its limit
HEALTHY = 20
HANG_TIMEOUT_S = 4.0
BOUND_S = 1.0     # every healthy delivery within this of its claim; the hang timeout is 4 s


def _poll(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)   # poll interval, bounded by the deadline


@pytest.mark.parametrize("layout", ["two-tenants", "one-tenant-two-endpoints"])
def test_a_silent_endpoint_does_not_stall_a_healthy_one_on_the_same_origin(store, layout) -> None:
    sink = SinkServer()
    sink.start_in_thread()
    try:
        start = int(time.time()) * S
        clock = FakeClock(start)
        silent_tenant = add_tenant(store, "silent", now_us=start)
        healthy_tenant = add_tenant(store, "healthy", now_us=start) if layout == "two-tenants" else silent_tenant
        hang = add_target(store, silent_tenant, url=f"{sink.base_url}/hang", now_us=start)
        ok = add_target(store, healthy_tenant, url=f"{sink.base_url}/ok", now_us=start)
        for tg in (hang, ok):
            sink.add_secret(tg.secret)
        silent_ids = [add_trigger(store, silent_tenant, hang, {"every": "3600s"}, now_us=start,
                                  policies=Policies(timeout_s=HANG_TIMEOUT_S, max_attempts=1))[0].id
                      for _ in range(SILENT)]
        healthy_ids: list[str] = []
        timing = TimingLoop(store, clock, "t1")

        def hung() -> int:
            return sum(1 for r in sink.records() if r["path"] == "/hang")

        async def run() -> list[float]:
            async with Dispatcher(store, clock, "d1") as d:
                clock.set(start + 3600 * S + S // 10)
                assert len(timing.tick().inserted) == SILENT
                await d.claim_once()
                # The silent flow is at its limit: its requests are written and held open.
                await asyncio.to_thread(_poll, lambda: hung() >= 4, 10, "the silent endpoint's requests")
                now = clock.now().latest_us
                healthy_ids.extend(add_trigger(store, healthy_tenant, ok, {"every": "60s"}, now_us=now)[0].id
                                   for _ in range(HEALTHY))
                clock.set(now + 60 * S + S // 10)   # the silent triggers' next instants are an hour away
                assert len(timing.tick().inserted) == HEALTHY
                claimed_at = time.time()
                started = 0
                while started < HEALTHY:
                    n = await d.claim_once()
                    assert n > 0, "the healthy fires are claimed at once (shaping leaves them room)"
                    started += n

                def arrivals() -> list[float] | None:
                    got = [r["arrived_at"] - claimed_at for r in sink.records() if r["path"] == "/ok"]
                    return got if len(got) >= HEALTHY else None

                late = await asyncio.to_thread(_poll, arrivals, 3 * HANG_TIMEOUT_S, "the healthy deliveries")
                await d.flush()   # the silent attempts end at their timeout
                return late

        late = asyncio.run(run())
        hung_keys = {(r["fire_key"], r["attempt"]) for r in sink.records() if r["path"] == "/hang"}
    finally:
        sink.stop()
    assert len(late) == HEALTHY
    # Delivered long before the silent requests' 4 s timeout freed anything.
    assert max(late) <= BOUND_S, f"healthy deliveries waited behind the silent endpoint: {sorted(late)[-3:]}"
    for tid in healthy_ids:
        assert [f.state for f in store.history.list_fires(healthy_tenant.id, tid)] == ["delivered"]
    # The silent fires: a written attempt ends unknown; one that never got a connection (the silent
    # flow's limit was in use until its deadline) was not sent: retry, naming the limit.
    for tid in silent_ids:
        for f in store.history.list_fires(silent_tenant.id, tid):
            for a in f.attempt_list:
                written = (str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)), a.number) in hung_keys
                if written:
                    assert a.result == "unknown", a
                else:
                    assert a.result == "retry" and "free connection" in (a.error or ""), a
