"""The fire path in one process, real parts: timing loop + attempt runner + real HTTP to a local
sink, on real SQLite and real PostgreSQL. Every delivery carries its key and a valid Standard
Webhooks signature and arrives at or after its scheduled instant by the sink's clock."""

from __future__ import annotations

import asyncio

import pytest

from fireledger.clock import SystemClock
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.keys import FireKey, to_us
from fireledger.domain.model import Policies
from fireledger.recurrence import parse_instant
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import add_target, add_tenant, add_trigger, run_planes_until

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
def sink():
    s = SinkServer(secrets=[SECRET])
    s.start_in_thread()
    yield s
    s.stop()


async def _run_until(planes, predicate, timeout_s):
    await run_planes_until(planes, predicate, timeout_s)


def test_interval_cron_and_one_shot_are_delivered_signed_and_never_early(store, sink):
    clock = SystemClock(declared_eps_us=2_000)
    t = add_tenant(store)
    ok = add_target(store, t, url=f"{sink.base_url}/ok", secret=SECRET)
    now = clock.now().latest_us
    interval, _, _ = add_trigger(store, t, ok, {"every": "1s"}, now_us=now)
    cron, _, _ = add_trigger(store, t, ok, {"cron": "* * * * * *"}, now_us=now)     # 6 fields: every second
    at_us = (now // 1_000_000 + 2) * 1_000_000
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant
    once, _, _ = add_trigger(store, t, ok, {"at": format_instant(from_us(at_us))}, now_us=now)

    dispatcher = Dispatcher(store, clock, "d1")
    timing = TimingLoop(store, clock, "t1", on_committed=lambda fires: dispatcher.wake())

    def enough():
        recs = sink.records()
        got = {r["trigger_id"] for r in recs}
        return {interval.id, cron.id, once.id} <= got and len(recs) >= 7

    asyncio.run(_run_until([dispatcher, timing], enough, 20))
    recs = sink.records()
    assert recs, "nothing delivered"
    for r in recs:
        assert r["signature_ok"], r["signature_error"]
        assert r["fire_key_header"] == r["fire_key"]
        key = FireKey.parse(r["fire_key"])
        assert key.trigger_id == r["trigger_id"] and key.tenant_id == t.id
        sched = to_us(parse_instant(r["scheduled_instant"]))
        assert key.scheduled_us == sched
        assert r["arrived_at"] * 1e6 >= sched, f"early by {(sched - r['arrived_at'] * 1e6) / 1e3:.1f} ms"
        assert r["lane"] == "on-time" and r["kind"] == "scheduled" and r["attempt"] == 1
    assert [r for r in recs if r["trigger_id"] == once.id][0]["scheduled_instant"] == format_instant(
        from_us(at_us))
    # History shows each delivered fire with its attempt.
    for r in recs:
        f = store.history.get_fire(FireKey.parse(r["fire_key"]))
        assert f is not None and f.attempts >= 1
    delivered = [f for f in store.history.list_fires(t.id, interval.id, None, 100) if f.state == "delivered"]
    assert delivered and all(f.attempt_list[0].http_status == 200 for f in delivered)


def test_failures_retry_under_the_same_key_and_final_4xx_is_failed(store, sink):
    clock = SystemClock(declared_eps_us=2_000)
    t = add_tenant(store)
    flaky = add_target(store, t, url=f"{sink.base_url}/fail-first/1", secret=SECRET)
    gone = add_target(store, t, url=f"{sink.base_url}/status/404", secret=SECRET)
    now = clock.now().latest_us
    at = (now // 1_000_000 + 1) * 1_000_000
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant
    spec = {"at": format_instant(from_us(at))}
    tr_flaky, _, _ = add_trigger(store, t, flaky, spec, now_us=now, policies=Policies(max_attempts=3))
    tr_gone, _, _ = add_trigger(store, t, gone, spec, now_us=now)
    dispatcher = Dispatcher(store, clock, "d1")
    timing = TimingLoop(store, clock, "t1", on_committed=lambda fires: dispatcher.wake())

    def settled():
        a = store.history.list_fires(t.id, tr_flaky.id)
        b = store.history.list_fires(t.id, tr_gone.id)
        return a and b and a[0].state == "delivered" and b[0].state == "failed"

    asyncio.run(_run_until([dispatcher, timing], settled, 20))
    [fa] = store.history.list_fires(t.id, tr_flaky.id)
    assert [a.result for a in fa.attempt_list] == ["retry", "delivered"]
    keys = [r["fire_key"] for r in sink.records() if r["trigger_id"] == tr_flaky.id]
    assert len(keys) == 2 and len(set(keys)) == 1              # the same key on every attempt
    [fb] = store.history.list_fires(t.id, tr_gone.id)
    assert fb.cause == "failed: HTTP 404 is final" and fb.attempts == 1
