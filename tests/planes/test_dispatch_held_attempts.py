"""Attempts beyond their flow's connection limit are held by the runner, not started (decision 0242).

A claim round may admit more HTTP attempts of one flow (tenant, origin, path) than the flow's
adaptive limit lets be in flight (decision 0133). The runner starts only as many as the limit
allows and holds the rest as plain entries, first come first served, until an attempt of the flow
ends; an attempt still held at its timeout is not sent (its lease lasts its timeout plus a
margin): it is recorded ``retry``, naming the limit, as a wait in the pool was. At stop, what is
still held past the drain is abandoned with the attempts in flight (leases lapse).

Counts, not times: how many attempts are running and held, in which order the receiver saw them,
how many requests it got. Real SQLite/PostgreSQL, real timing loop and dispatcher, real HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from e2e import wait_until
from fireledger.clock import FakeClock
from fireledger.dispatch.http import HttpSender
from fireledger.dispatch.pool import INITIAL_ORIGIN_LIMIT
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.dispatch_records import ClaimResult
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Policies
from fireledger.store import Store
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000


async def _until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``predicate`` on the loop (the dispatcher runs on it) until true or the deadline."""
    deadline = time.monotonic() + timeout_s
    while not (got := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)   # poll interval, bounded by the deadline
    return got


class _Recording(Dispatcher):
    """The runner, remembering the fire keys of its claims in the order they were claimed, and the
    most attempts of one flow it had started and not finished at once."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.claimed: list[str] = []
        self.peak = 0

    def _spawn(self, *a: Any, **kw: Any) -> None:
        super()._spawn(*a, **kw)
        self.peak = max(self.peak, *self._gate.busy.values())

    def _take(self, res: ClaimResult) -> None:
        for c in res.jobs:
            f = c.job.fire
            self.claimed.append(str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)))
        super()._take(res)


def _fires(store: Store, sink: SinkServer, path: str, start: int, n: int, policies: Policies,
           tenant: Any = None, target: Any = None) -> tuple[Any, Any, list[str]]:
    """``n`` hourly triggers of one tenant to one target (one flow), first fires at start + 1 h."""
    t = tenant or add_tenant(store, now_us=start)
    tg = target or add_target(store, t, url=f"{sink.base_url}{path}", now_us=start)
    sink.add_secret(tg.secret)
    ids = [add_trigger(store, t, tg, {"every": "3600s"}, now_us=start, policies=policies)[0].id for _ in range(n)]
    return t, tg, ids


def test_held_attempts_start_in_claim_order_and_never_beyond_the_flow_limit(store) -> None:
    sink = SinkServer()
    sink.start_in_thread()
    try:
        start = int(time.time()) * S
        clock = FakeClock(start)
        n = 10
        _fires(store, sink, "/ok", start, n, Policies(timeout_s=10.0, max_attempts=1))
        timing = TimingLoop(store, clock, "t1")

        async def run() -> tuple[list[str], tuple[int, int], int]:
            # One connection per flow: the receiver sees the flow's requests one after the other.
            async with _Recording(store, clock, "d1", sender=HttpSender(limit_per_host=1)) as d:
                clock.set(start + 3600 * S + S // 10)
                assert len(timing.tick().inserted) == n
                assert await d.claim_once() == n
                running = (len(d._tasks), d.held)
                await d.flush()
                assert d.held == 0 and not d._tasks
                await d.sender.close()   # type: ignore[union-attr]
                return d.claimed, running, d.peak

        claimed, running, peak = asyncio.run(run())
        seen = [r["fire_key_header"] for r in sink.records() if r["path"] == "/ok"]
    finally:
        sink.stop()
    assert running == (1, n - 1), "attempts of a flow at its limit are held, not started as tasks"
    assert peak == 1, "more attempts of the flow were started than its limit (1) allows"
    assert len(claimed) == n
    assert seen == claimed, "the flow's attempts reach the receiver first come first served"


def test_an_attempt_held_until_its_timeout_is_not_sent_and_is_recorded_retry(store) -> None:
    sink = SinkServer()
    sink.start_in_thread()
    try:
        start = int(time.time()) * S
        clock = FakeClock(start)
        long_n, short_n = INITIAL_ORIGIN_LIMIT, 8
        # The long attempts hold the flow's connections (the receiver never answers) well past
        # the short ones' timeout; the short ones wait behind them and must not be sent.
        t, tg, _ = _fires(store, sink, "/hang", start, long_n, Policies(timeout_s=20.0, max_attempts=1))
        timing = TimingLoop(store, clock, "t1")

        def hung() -> int:
            return sum(1 for r in sink.records() if r["path"] == "/hang")

        async def run() -> tuple[int, int, int, int]:
            async with Dispatcher(store, clock, "d1") as d:
                clock.set(start + 3600 * S + S // 10)
                assert len(timing.tick().inserted) == long_n
                assert await d.claim_once() == long_n
                await asyncio.to_thread(wait_until, lambda: hung() >= long_n, 10, "the long attempts' requests")
                now = clock.now().latest_us
                short_ids.extend(add_trigger(store, t, tg, {"every": "60s"}, now_us=now,
                                             policies=Policies(timeout_s=0.5, max_attempts=2))[0].id
                                 for _ in range(short_n))
                clock.set(now + 60 * S + S // 10)   # the long triggers' next fires are an hour away
                assert len(timing.tick().inserted) == short_n
                assert await d.claim_once() == short_n
                held = d.held
                # Settled at their own timeout, while the long attempts still hold every connection.
                await _until(lambda: len(d._results) >= short_n, 10, "the held attempts' results")
                still_running = sum(1 for task in d._tasks if not task.done())
                sent_meanwhile = hung()
                assert d.sender is not None
                await d.sender.close()   # ends the long attempts (their connections closed: retry)
                await d.flush()
                return held, still_running, sent_meanwhile, d.held

        short_ids: list[str] = []
        held, still_running, sent_meanwhile, held_after = asyncio.run(run())
        sent = hung()
    finally:
        sink.stop()
    assert held == short_n, "the flow was at its limit: the new attempts are held"
    assert still_running == long_n, "the held attempts were settled at their timeout, not when a slot freed"
    assert sent_meanwhile == long_n and sent == long_n, "an attempt held past its timeout was sent"
    assert held_after == 0
    for tid in short_ids:
        [f] = store.history.list_fires(t.id, tid)
        [a] = f.attempt_list
        assert a.result == "retry", a
        assert "timed out before the request was sent" in (a.error or "") and "free connection" in (a.error or ""), a
        assert f.state == "pending" and f.next_attempt_us is not None, f


def test_stop_abandons_held_attempts_with_the_ones_in_flight(store) -> None:
    sink = SinkServer()
    sink.start_in_thread()
    try:
        start = int(time.time()) * S
        clock = FakeClock(start)
        n = 12
        t, _tg, ids = _fires(store, sink, "/hang", start, n, Policies(timeout_s=20.0, max_attempts=2))
        clock.set(start + 3600 * S + S // 10)
        assert len(TimingLoop(store, clock, "t1").tick().inserted) == n

        def hung() -> int:
            return sum(1 for r in sink.records() if r["path"] == "/hang")

        async def run() -> tuple[int, int, int]:
            d = Dispatcher(store, clock, "d1", idle_s=0.05)
            task = asyncio.create_task(d.run())
            await _until(lambda: d.held == n - INITIAL_ORIGIN_LIMIT, 10, "attempts held behind the flow's limit")
            await asyncio.to_thread(wait_until, lambda: hung() >= INITIAL_ORIGIN_LIMIT, 10, "the requests in flight")
            d.stop(drain_s=0.2)
            await task
            return d.held, len(d._tasks), d._inflight

        held, tasks, inflight = asyncio.run(run())
        sent = hung()
    finally:
        sink.stop()
    assert (held, tasks, inflight) == (0, 0, 0), "a held attempt outlived run() or was started at stop"
    assert sent == INITIAL_ORIGIN_LIMIT
    for tid in ids:   # nothing recorded: the leases lapse and the fires are attempted again
        [f] = store.history.list_fires(t.id, tid)
        assert f.state == "dispatching", f
        assert all(a.finished_us is None for a in f.attempt_list), f


def test_held_attempts_are_started_and_recorded_within_the_drain(store) -> None:
    sink = SinkServer()
    sink.start_in_thread()
    try:
        start = int(time.time()) * S
        clock = FakeClock(start)
        n = 12
        t, _tg, ids = _fires(store, sink, "/slow/1", start, n, Policies(timeout_s=20.0, max_attempts=1))
        clock.set(start + 3600 * S + S // 10)
        assert len(TimingLoop(store, clock, "t1").tick().inserted) == n

        async def run() -> int:
            d = Dispatcher(store, clock, "d1", idle_s=0.05)
            task = asyncio.create_task(d.run())
            await _until(lambda: d.held == n - INITIAL_ORIGIN_LIMIT, 10, "attempts held behind the flow's limit")
            held = d.held
            d.stop(drain_s=30.0)   # ample: the held ones start as the first ones end, within the drain
            await task
            return held

        held_at_stop = asyncio.run(run())
        sent = sum(1 for r in sink.records() if r["path"] == "/slow/1")
    finally:
        sink.stop()
    assert held_at_stop == n - INITIAL_ORIGIN_LIMIT
    assert sent == n
    for tid in ids:
        assert [f.state for f in store.history.list_fires(t.id, tid)] == ["delivered"]
