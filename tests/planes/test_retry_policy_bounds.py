"""A trigger's retry policy where the dispatcher applies it (decision 0147): the steppable Dispatcher
(``claim_once()`` / ``flush()``) against a real HTTP receiver that keeps failing, a FakeClock and a
real store on both engines. Each of three triggers ends by a different bound — its attempts, its
event age, the trigger's next instant — and the fire's cause names that bound; the backoff stays
between half and all of the policy's step."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from fireledger.clock import FakeClock
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.keys import from_us
from fireledger.domain.model import Policies
from fireledger.recurrence import format_instant
from fireledger.store import Store
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import add_target, add_tenant, add_trigger

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
S = 1_000_000


@pytest.fixture
def sink():
    s = SinkServer(secrets=[SECRET])
    s.start_in_thread()
    yield s
    s.stop()


def _scenario(store: Store, sink: SinkServer, start: int) -> dict[str, Any]:
    """``attempts``: 500 always, 3 attempts, backoff 2s doubling to 3s (hourly). ``age``: 503 with
    ``Retry-After: 30``, 10 attempts, event age 60s (hourly). ``next``: the same 503, 10 attempts, no
    age bound, every 60s: the second retry would reach the next instant."""
    t = add_tenant(store, now_us=start)
    out: dict[str, Any] = {"tenant": t}
    plans = (("attempts", "/fail", "3600s", Policies(max_attempts=3, min_backoff_s=2.0, max_backoff_s=3.0)),
             ("age", "/retry-after/30", "3600s", Policies(max_attempts=10, max_event_age_s=60)),
             ("next", "/retry-after/30", "60s", Policies(max_attempts=10)))
    for name, path, every, policies in plans:
        tg = add_target(store, t, url=f"{sink.base_url}{path}", secret=SECRET, now_us=start)
        anchor = format_instant(from_us(start + 60 * S - 3600 * S))    # every first instant: start + 60 s
        trig, _, first = add_trigger(store, t, tg, {"every": every, "anchor": anchor}, now_us=start,
                                     payload={"n": name}, policies=policies)
        out[name], out[f"{name}_first"] = trig, first
    return out


def _fire(store: Store, sc: dict[str, Any], name: str):
    [f] = store.history.list_fires(sc["tenant"].id, sc[name].id)
    return f


def test_each_bound_ends_its_fire_and_the_cause_names_it(store, sink) -> None:
    start = int(time.time()) * S          # a whole second of real time: the sink's replay window holds
    clock = FakeClock(start)
    sc = _scenario(store, sink, start)
    first = sc["attempts_first"]
    assert first == sc["age_first"] == sc["next_first"] == start + 60 * S
    t1 = first + S // 10
    clock.set(t1)
    assert len(TimingLoop(store, clock, "t1").tick().inserted) == 3

    async def step(d: Dispatcher, n: list[int]) -> None:
        n.append(await d.claim_once())
        await d.flush()

    async def steps() -> list[int]:
        n = []
        async with Dispatcher(store, clock, "d1") as d:
            await step(d, n)                    # all three: attempt 1
            a = _fire(store, sc, "attempts")
            # Step 1 of 2s (equal jitter): between 1s and 2s later.
            assert a.state == "pending" and t1 + S <= a.next_attempt_us <= t1 + 2 * S
            for name in ("age", "next"):   # Retry-After 30 is more than the jittered 1 s step
                f = _fire(store, sc, name)
                assert f.state == "pending" and f.next_attempt_us == t1 + 30 * S
            t2 = a.next_attempt_us
            clock.set(t2)
            await step(d, n)                    # attempts: attempt 2
            a = _fire(store, sc, "attempts")
            # Step 2: 4s capped at max_backoff 3s, jittered: between 1.5s and 3s.
            assert t2 + 3 * S // 2 <= a.next_attempt_us <= t2 + 3 * S
            clock.set(a.next_attempt_us)
            await step(d, n)                    # attempts: 3 of 3, ends
            clock.set(t1 + 30 * S)
            # age: 30 s more would reach 60.1 s after the instant (> 60 s); next: the next instant is
            # 29.9 s away, the retry would reach it.
            await step(d, n)
            clock.set(t1 + 3600 * S)
            await step(d, n)                    # nothing is left
        return n

    assert asyncio.run(steps()) == [3, 1, 1, 2, 0]
    a, age, nxt = (_fire(store, sc, k) for k in ("attempts", "age", "next"))
    assert (a.state, a.attempts) == ("failed", 3)
    assert a.cause == "failed: retries exhausted after 3 attempts (last: HTTP 500)"
    assert (age.state, age.attempts) == ("failed", 2)
    assert age.cause == "failed: retries ended by retry.max_event_age (1m) after 2 attempts (last: HTTP 503)"
    assert (nxt.state, nxt.attempts) == ("failed", 2)
    assert nxt.cause == ("failed: retries truncated at the trigger's next instant after 2 attempts "
                         "(last: HTTP 503)")
    sent = [(r["trigger_id"], r["attempt"]) for r in sink.records()]
    for name, n in (("attempts", 3), ("age", 2), ("next", 2)):
        assert [k for tid, k in sent if tid == sc[name].id] == list(range(1, n + 1))
