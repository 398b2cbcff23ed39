"""A redriven dead letter through the dispatcher (decision 0148), on both engines with the steppable
Dispatcher and a real HTTP receiver: the further attempts carry the SAME fire key with the next attempt
numbers, the retry policy counts afresh from the redrive, and the history shows the redrive before the
attempts it made. A second redrive of a fire that is not dead, and a stale one, change nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from fireledger.clock import FakeClock
from fireledger.control.history import fire_story
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Policies
from fireledger.domain.trust_records import AuditNote
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


async def _drain(d: Dispatcher, clock: FakeClock, store: Store, key: FireKey) -> None:
    """Claim, record, and step the clock to each retry until the fire is no longer pending."""
    for _ in range(10):
        await d.claim_once()
        await d.flush()
        f = store.history.get_fire(key)
        assert f is not None
        if f.state != "pending":
            return
        assert f.next_attempt_us is not None
        clock.set(max(clock.now().latest_us, f.next_attempt_us))
    raise AssertionError("the fire kept retrying")


def _world(store: Store, sink: SinkServer, start: int, path: str) -> tuple[Any, Any, FireKey]:
    t = add_tenant(store, now_us=start)
    tg = add_target(store, t, url=f"{sink.base_url}{path}", secret=SECRET, now_us=start)
    trig, version, first = add_trigger(store, t, tg, {"every": "3600s"}, now_us=start, payload={"n": 1},
                                       policies=Policies(max_attempts=2, max_backoff_s=1.0))
    assert first is not None
    return t, version, FireKey(t.id, trig.id, first, 0)


def test_a_redrive_delivers_under_the_same_key_after_the_target_recovers(store, sink) -> None:
    start = int(time.time()) * S
    clock = FakeClock(start)
    # 500 to the first 2 requests of each fire key, then 200: the target "recovers" after them.
    t, version, key = _world(store, sink, start, "/fail-first/2")
    clock.set(key.scheduled_us + S // 10)
    assert len(TimingLoop(store, clock, "t1").tick().inserted) == 1

    async def run() -> None:
        async with Dispatcher(store, clock, "d1") as d:
            await _drain(d, clock, store, key)
            dead = store.history.get_fire(key)
            assert dead is not None and dead.state == "failed" and dead.attempts == 2
            assert dead.cause == "failed: retries exhausted after 2 attempts (last: HTTP 500)"
            now = clock.now().latest_us
            note = AuditNote(t.id, "test", "fire.redrive", now, None, {"fire_key": str(key)})
            assert store.dispatch.redrive_fires([key], now, not_before_us=0, audit=note) == [key]
            assert store.dispatch.redrive_fires([key], now, not_before_us=0) == []     # pending: not dead
            await _drain(d, clock, store, key)

    asyncio.run(run())
    f = store.history.get_fire(key)
    assert f is not None and f.state == "delivered" and f.cause is None
    assert (f.attempts, f.attempt_base) == (3, 2) and f.redriven_us is not None
    assert [a.result for a in f.attempt_list] == ["retry", "retry", "delivered"]
    sent = [(r["fire_key"], r["attempt"]) for r in sink.records()]
    assert sent == [(str(key), 1), (str(key), 2), (str(key), 3)]          # one key, attempt numbers go on
    assert store.history.list_fires(t.id, key.trigger_id) == [f]            # never a new fire
    story = [line for _, line in fire_story(f, None, version)]
    at = next(i for i, line in enumerate(story) if line.startswith("redriven after 2 attempts"))
    assert story[at + 1].startswith("attempt 3 ") and story[at - 1].startswith("attempt 2 ")
    assert any(line.startswith("retry policy of version 1: 2 attempts") for line in story)


def test_a_redriven_fire_gets_its_retry_policy_afresh(store, sink) -> None:
    start = int(time.time()) * S
    clock = FakeClock(start)
    t, _, key = _world(store, sink, start, "/fail")                          # never recovers
    clock.set(key.scheduled_us + S // 10)
    TimingLoop(store, clock, "t1").tick()

    async def run() -> None:
        async with Dispatcher(store, clock, "d1") as d:
            await _drain(d, clock, store, key)
            # Past retention (not_before_us after the instant): left out, nothing written.
            now = clock.now().latest_us
            assert store.dispatch.redrive_fires([key], now, not_before_us=key.scheduled_us + 1) == []
            assert store.dispatch.redrive_fires([key], now, not_before_us=0) == [key]
            await _drain(d, clock, store, key)

    asyncio.run(run())
    f = store.history.get_fire(key)
    assert f is not None and f.state == "failed" and (f.attempts, f.attempt_base) == (4, 2)
    # Two more attempts (max_attempts 2 counted from the redrive), then the attempts bound again.
    assert f.cause == "failed: retries exhausted after 4 attempts (last: HTTP 500)"
    assert [r["attempt"] for r in sink.records()] == [1, 2, 3, 4]
