"""The steppable attempt runner: ``Dispatcher.claim_once()`` / ``flush()`` drive one claim round and the
recording of its results, as ``TimingLoop.tick()`` drives the timing loop — with a FakeClock, a real
store on both engines and real HTTP to a local sink, and no sleeping. Retries become claimable only when
the clock passes their retry instant, and stepping gives the same ledger as ``run()``."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fireledger.clock import FakeClock
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Policies
from fireledger.store import Store
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import add_target, add_tenant, add_trigger, open_store

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
S = 1_000_000


@pytest.fixture(params=["sqlite", "postgres"])   # two stores of one engine (the shared `store` is one)
def engine(request: pytest.FixtureRequest) -> tuple[str, Any]:
    pg = request.getfixturevalue("pg_server") if request.param == "postgres" else None
    return request.param, pg


@pytest.fixture
def sink():
    s = SinkServer(secrets=[SECRET])
    s.start_in_thread()
    yield s
    s.stop()


def _origin() -> int:
    """A whole second of real time: the fake clock starts there so the sink's replay window accepts
    the signatures."""
    return int(time.time()) * S


def _scenario(store: Store, sink: SinkServer, start: int) -> dict[str, Any]:
    """Four hourly triggers (one fire each in the first tick): one delivered at once, one answered 500
    then 200, one final 404, one answered 503 with ``Retry-After: 30`` twice (attempts run out)."""
    t = add_tenant(store, now_us=start)
    out: dict[str, Any] = {"tenant": t}
    for name, path, attempts in (("ok", "/ok", 3), ("flaky", "/fail-first/1", 3), ("gone", "/status/404", 3),
                                 ("busy", "/retry-after/30", 2)):
        tg = add_target(store, t, url=f"{sink.base_url}{path}", secret=SECRET, now_us=start)
        trig, _, first = add_trigger(store, t, tg, {"every": "3600s"}, now_us=start, payload={"n": name},
                                     policies=Policies(max_attempts=attempts))
        out[name] = trig
        out["first"] = first
    return out


def _fire(store: Store, sc: dict[str, Any], name: str):
    [f] = store.history.list_fires(sc["tenant"].id, sc[name].id)
    return f


def test_a_due_fire_is_delivered_by_one_claim_and_flush(store, sink) -> None:
    start = _origin()
    clock = FakeClock(start)
    t = add_tenant(store, now_us=start)
    tg = add_target(store, t, url=f"{sink.base_url}/ok", secret=SECRET, now_us=start)
    trig, _, first = add_trigger(store, t, tg, {"every": "60s"}, now_us=start, payload={"n": 1})
    assert first is not None
    clock.set(first + S // 10)

    async def steps() -> tuple[int, int, int, int]:
        async with Dispatcher(store, clock, "d1") as d:
            before = await d.claim_once()                 # nothing committed yet
            assert len(TimingLoop(store, clock, "t1").tick().inserted) == 1
            started = await d.claim_once()
            recorded = await d.flush()
            again = await d.claim_once()                  # delivered: never claimed again
            return before, started, recorded, again + d.delivered * 10

    before, started, recorded, rest = asyncio.run(steps())
    assert (before, started, recorded, rest) == (0, 1, 1, 10)
    [r] = sink.records()                                  # already there: flush() waited for the attempt
    assert r["signature_ok"], r["signature_error"]
    assert r["fire_key"] == str(FireKey(t.id, trig.id, first, 0)) and r["attempt"] == 1
    [f] = store.history.list_fires(t.id, trig.id)
    assert f.state == "delivered" and f.attempts == 1 and f.next_attempt_us is None
    [a] = f.attempt_list
    assert a.result == "delivered" and a.http_status == 200 and a.started_us == a.finished_us == first + S // 10


def test_retries_become_claimable_only_when_the_clock_passes_their_instant(store, sink) -> None:
    start = _origin()
    clock = FakeClock(start)
    sc = _scenario(store, sink, start)
    t1 = sc["first"] + S // 10
    clock.set(t1)
    assert len(TimingLoop(store, clock, "t1").tick().inserted) == 4

    async def steps() -> list[tuple[int, int]]:
        rounds = []
        async with Dispatcher(store, clock, "d1") as d:
            rounds.append((await d.claim_once(), await d.flush()))      # all four attempted once
            busy = _fire(store, sc, "busy")
            flaky = _fire(store, sc, "flaky")
            # The 503 asked for 30 s: exactly that (jitter only lengthens the plain backoff).
            assert busy.state == "pending" and busy.next_attempt_us == t1 + 30 * S
            assert busy.attempt_list[0].result == "retry" and busy.attempt_list[0].http_status == 503
            assert flaky.state == "pending" and t1 + S // 2 <= flaky.next_attempt_us <= t1 + S
            rounds.append((await d.claim_once(), await d.flush()))      # same reading: nothing is due
            clock.set(flaky.next_attempt_us - 1)
            rounds.append((await d.claim_once(), await d.flush()))      # just before: still nothing
            clock.set(flaky.next_attempt_us)
            rounds.append((await d.claim_once(), await d.flush()))      # the 500's retry
            clock.set(busy.next_attempt_us - 1)
            rounds.append((await d.claim_once(), await d.flush()))
            clock.set(busy.next_attempt_us)
            rounds.append((await d.claim_once(), await d.flush()))      # the 503's retry, the last attempt
            rounds.append((await d.claim_once(), await d.flush()))
        return rounds

    assert asyncio.run(steps()) == [(4, 4), (0, 0), (0, 0), (1, 1), (0, 0), (1, 1), (0, 0)]
    assert _fire(store, sc, "ok").state == "delivered"
    gone = _fire(store, sc, "gone")
    assert gone.state == "failed" and gone.cause == "failed: HTTP 404 is final" and gone.attempts == 1
    flaky = _fire(store, sc, "flaky")
    assert flaky.state == "delivered" and [a.result for a in flaky.attempt_list] == ["retry", "delivered"]
    busy = _fire(store, sc, "busy")
    assert busy.state == "failed" and [a.result for a in busy.attempt_list] == ["retry", "retry"]
    assert busy.cause == "failed: retries exhausted after 2 attempts (last: HTTP 503)"
    assert busy.attempt_list[1].started_us == t1 + 30 * S
    by_trigger: dict[str, list[tuple[str, int]]] = {}
    for r in sink.records():
        by_trigger.setdefault(r["trigger_id"], []).append((r["fire_key"], r["attempt"]))
    for name, n in (("ok", 1), ("flaky", 2), ("gone", 1), ("busy", 2)):
        sent = by_trigger[sc[name].id]
        assert [a for _, a in sent] == list(range(1, n + 1)) and len({k for k, _ in sent}) == 1  # one key


def _ledger(store: Store, sc: dict[str, Any]) -> dict[str, Any]:
    """The fires of a scenario without the ids that differ between two stores."""
    return {name: replace(_fire(store, sc, name), tenant_id="", trigger_id="")
            for name in ("ok", "flaky", "gone", "busy")}


async def _run_through_retries(d: Dispatcher, clock: FakeClock, later_us: int, fires: Any) -> None:
    """``run()`` until every fire's first attempt is recorded, then with the clock at ``later_us`` until
    every fire is final (each wait polled with a deadline)."""
    task = asyncio.create_task(d.run())
    try:
        for done in (lambda: all(f.attempts == 1 and f.state != "dispatching" for f in fires()),
                     lambda: all(f.state in ("delivered", "failed") for f in fires())):
            deadline = time.monotonic() + 20
            while not done():
                assert time.monotonic() < deadline, "run() did not get there in time"
                assert not task.done(), task
                await asyncio.sleep(0.02)   # poll interval, bounded by the deadline above
            clock.set(later_us)
    finally:
        d.stop()
        await task


async def _step_through_retries(d: Dispatcher, clock: FakeClock, later_us: int) -> None:
    """The stepping API: one round and its results, then the same with the clock at ``later_us``."""
    async with d:
        await d.claim_once()
        await d.flush()
        clock.set(later_us)
        await d.claim_once()
        await d.flush()


def _drive(store: Store, sink: SinkServer, start: int, stepping: bool) -> tuple[Any, ...]:
    """The scenario on ``store``, dispatched by stepping or by ``run()``: its ledger, the dispatcher's
    count of deliveries, and what the sink received for it."""
    clock = FakeClock(start)
    sc = _scenario(store, sink, start)
    t1 = sc["first"] + S // 10
    clock.set(t1)
    assert len(TimingLoop(store, clock, "t1").tick().inserted) == 4
    seen = len(sink.records())
    d = Dispatcher(store, clock, "d1", idle_s=0.05)
    later = t1 + 31 * S   # past both retry instants
    if stepping:
        asyncio.run(_step_through_retries(d, clock, later))
    else:
        fires = lambda: [_fire(store, sc, n) for n in ("ok", "flaky", "gone", "busy")]  # noqa: E731
        asyncio.run(_run_through_retries(d, clock, later, fires))
    sent = sorted((r["path"], r["attempt"], r["status"]) for r in sink.records(seen))
    return _ledger(store, sc), d.delivered, sent


def test_run_and_stepping_give_the_same_ledger(engine, tmp_path: Path, sink) -> None:
    start = _origin()
    results = []
    for sub, stepping in (("stepped", True), ("ran", False)):
        (tmp_path / sub).mkdir()
        store = open_store(engine[0], tmp_path / sub, engine[1])
        try:
            results.append(_drive(store, sink, start, stepping))
        finally:
            store.close()
    stepped, ran = results
    assert stepped[0] == ran[0]
    assert stepped[1:] == ran[1:] and stepped[1] == 2 and len(stepped[2]) == 6


def test_stepping_is_refused_while_run_is_running(store) -> None:
    clock = FakeClock(_origin())
    d = Dispatcher(store, clock, "d1", idle_s=0.05)

    async def main() -> str:
        task = asyncio.create_task(d.run())
        await asyncio.sleep(0)   # let run() start (one loop turn, not a wait for a condition)
        try:
            with pytest.raises(RuntimeError, match="while run\\(\\) is running"):
                await d.claim_once()
            with pytest.raises(RuntimeError, match="while run\\(\\) is running"):
                await d.flush()
            return "refused"
        finally:
            d.stop()
            await task

    assert asyncio.run(main()) == "refused"
