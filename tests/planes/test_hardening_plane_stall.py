"""Hardening (issue 13, high #2), class: **no input from a target or a tenant may stall a plane for
others** (DESIGN.md invariant 15).

The instance the review found: a target answering ``503`` with ``Retry-After: 10000000000000`` to a
one-shot trigger made the retry instant overflow the store's 64-bit integer; the batch settlement
raised, the flusher put the batch back and retried it forever, and nothing that dispatch process did
was recorded again — every tenant's fires stuck in ``dispatching``. The members checked here: both
forms of ``Retry-After`` (delta seconds, HTTP-date) and non-finite values; an instant computed from
any of them; a batch with one item the store cannot record (the others are recorded, that one is set
aside with a cause); the whole path with real HTTP, a real store and the real timing loop.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import pytest

from fireledger.clock import SystemClock
from fireledger.dispatch.http import HttpResult, parse_retry_after
from fireledger.dispatch.lanes import DispatchConfig
from fireledger.dispatch.runner import Dispatcher, _Shaper, settle
from fireledger.dispatch.shaping import Capacity
from fireledger.domain.keys import from_us
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire, Policies
from fireledger.recurrence import format_instant
from fireledger.store import Settlement
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import T0, PlanesThread, add_target, add_tenant, add_trigger, open_store

S = 1_000_000
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
INT64_MAX = 2**63 - 1
#: 9999-12-31T23:59:59.999999Z: the latest instant the store may hold (formattable, fits int64).
LATEST_US = 253_402_300_799_999_999
#: The longest wait a Retry-After may impose (decision 0082).
ONE_HOUR_S = 3600.0
ABSURD = "10000000000000"


# --- the delay a target asks for ---------------------------------------------------------------


@pytest.mark.parametrize(("value", "date"), [
    (ABSURD, None),
    ("1e308", None),
    ("99999999999999999999999999999999", None),
    ("Fri, 31 Dec 9999 23:59:59 GMT", "Wed, 21 Oct 2015 07:28:00 GMT"),
    ("Wed, 21 Oct 2015 07:28:00 GMT", "Thu, 01 Jan 1970 00:00:00 GMT"),
])
def test_retry_after_is_capped_in_both_forms(value: str, date: str | None) -> None:
    got = parse_retry_after(value, date_header=date)
    assert got is not None and 0 <= got <= ONE_HOUR_S, got


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-5", "1e400"])
def test_retry_after_that_is_not_a_finite_delay_is_ignored(value: str) -> None:
    assert parse_retry_after(value) is None


def _job(store: Any, tenant_name: str, schedule: dict[str, Any], policies: Policies | None = None) -> Any:
    """A real leased job (one fire, claimed through the store)."""
    t = add_tenant(store, tenant_name)
    trig, _, first = add_trigger(store, t, add_target(store, t), schedule, policies=policies)
    assert first is not None
    _put(store, trig, [first])
    res = store.claim_shaped(first + S, "d", {"on-time": 10}, _shaper(), 5 * S)
    [claimed] = [c for c in res.jobs if c.job.fire.trigger_id == trig.id]
    return claimed.job


def _shaper() -> _Shaper:
    return _Shaper(DispatchConfig(), Capacity(1000, {"on-time": 1000, "catch-up": 1000, "backfill": 1000}, 1000))


def _put(store: Any, trig: Any, instants: list[int]) -> None:
    fires = tuple(NewFire(trig.tenant_id, trig.id, us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                          us, "2026f", "t") for us in instants)
    row = store.get_trigger(trig.tenant_id, trig.id)
    [o] = store.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), fires)])
    assert len(o.inserted) == len(instants)


@pytest.mark.parametrize("retry_after", [1e13, 1e300, math.inf, math.nan])
def test_a_retry_instant_is_bounded_whatever_the_target_sent(tmp_path, retry_after: float) -> None:
    s = open_store("sqlite", tmp_path, None)
    try:
        job = _job(s, "a", {"at": format_instant(from_us(T0 + 60 * S))})
        now = T0 + 61 * S
        out = settle(job, HttpResult("retry", 503, "HTTP 503", 0.01, retry_after_s=retry_after), now, 0.5, None)
        assert out.state == "pending"
        assert now < out.next_attempt_us <= now + int(ONE_HOUR_S * S), out.next_attempt_us - now
    finally:
        s.close()


# --- the store: one item never holds back a batch ------------------------------------------------


def test_a_batch_with_an_unrecordable_item_records_the_others(store) -> None:
    t = add_tenant(store, "a")
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    _put(store, trig, [T0 + i * S for i in range(3)])
    res = store.claim_shaped(T0 + 10 * S, "d", {"on-time": 10}, _shaper(), 5 * S)
    jobs = sorted((c.job for c in res.jobs), key=lambda j: j.fire.scheduled_us)
    assert len(jobs) == 3
    now = T0 + 11 * S
    batch = [
        # An instant past what the store can hold: clamped into the range, not a reason to refuse.
        Settlement(jobs[0], "retry", 503, "HTTP 503", "pending", None, 10**19),
        # A value no column can hold: this item is set aside with a cause, the others are recorded.
        Settlement(jobs[1], "delivered", 10**20, None, "delivered", None, None),
        Settlement(jobs[2], "delivered", 204, None, "delivered", None, None),
    ]
    oks = store.settle_dispatch(batch, now)
    assert oks == [True, False, True]
    got = {f.scheduled_us: f for f in store.list_fires(t.id, trig.id)}
    a, b, c = (got[j.fire.scheduled_us] for j in jobs)
    assert a.state == "pending" and a.next_attempt_us is not None and a.next_attempt_us <= LATEST_US
    assert b.state == "failed" and b.cause is not None
    assert "could not be recorded" in b.cause and ("Overflow" in b.cause or "OutOfRange" in b.cause), b.cause
    assert b.attempt_list[0].finished_us == now and b.attempt_list[0].http_status is None
    assert c.state == "delivered" and c.attempt_list[0].http_status == 204
    # The next batch is recorded as usual (nothing was left behind to poison it).
    res = store.claim_shaped(LATEST_US, "d", {"on-time": 10}, _shaper(), 5 * S)
    assert [j.job.fire.scheduled_us for j in res.jobs] == [jobs[0].fire.scheduled_us]
    assert store.settle_dispatch([Settlement(res.jobs[0].job, "delivered", 200, None, "delivered", None, None)],
                                 LATEST_US) == [True]


# --- end to end in one process: one tenant's poisoned target, another tenant's fires ----------------


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)   # poll interval, bounded by the deadline above


def test_a_poisoned_retry_after_does_not_stall_another_tenants_fires(store) -> None:
    clock = SystemClock(declared_eps_us=2_000)
    sink = SinkServer(secrets=[SECRET])
    base = sink.start_in_thread()
    try:
        now = clock.now().latest_us
        a = add_tenant(store, "poisoner", now_us=now)
        b = add_tenant(store, "bystander", now_us=now)
        poisoned = add_target(store, a, url=f"{base}/retry-after/{ABSURD}", secret=SECRET, now_us=now)
        ok = add_target(store, b, url=f"{base}/ok", secret=SECRET, now_us=now)
        at = {"at": format_instant(from_us((now // S + 1) * S))}
        one_shot, _, _ = add_trigger(store, a, poisoned, at, now_us=now)
        mine = [add_trigger(store, b, ok, {"every": "1s"}, now_us=now)[0] for _ in range(10)]
        d = Dispatcher(store, clock, "d1", idle_s=0.2)
        timing = TimingLoop(store, clock, "t1", on_committed=lambda fires: d.wake())
        planes = PlanesThread([d, timing]).start()

        def poisoned_recorded() -> bool:
            fs = store.list_fires(a.id, one_shot.id)
            return bool(fs) and bool(fs[0].attempt_list) and fs[0].attempt_list[0].finished_us is not None

        try:
            wait_until(lambda: any(r["path"].startswith("/retry-after") for r in sink.records()), 15,
                       "the poisoned target's 503")
            poisoned_at = clock.now().latest_us
            wait_until(poisoned_recorded, 10, "the 503 with an absurd Retry-After to be recorded")

            def delivered_since() -> bool:
                return all(sum(1 for f in store.list_fires(b.id, t.id)
                               if f.state == "delivered" and f.scheduled_us > poisoned_at) >= 3 for t in mine)

            wait_until(delivered_since, 20, "the other tenant's fires delivered and recorded after the 503")
        finally:
            stopped = planes.stop(15)
        assert stopped, "the dispatcher did not return within 15 s of stop()"
        assert planes.error is None, planes.error
        [f] = store.list_fires(a.id, one_shot.id)
        assert f.state == "pending" and f.attempt_list[0].http_status == 503
        assert f.next_attempt_us is not None and f.next_attempt_us <= poisoned_at + int((ONE_HOUR_S + 30) * S)
        later = clock.now().latest_us
        stuck = [g for t in mine for g in store.list_fires(b.id, t.id)
                 if g.state == "dispatching" and g.next_attempt_us is not None and g.next_attempt_us < later]
        assert stuck == []
    finally:
        sink.stop()


def test_a_blocking_internal_callable_cannot_take_every_thread() -> None:
    """One tenant's callable that blocks (its calls outlive their timeout and keep their threads)
    must leave threads for another tenant's callable."""
    from datetime import UTC, datetime

    from fireledger.dispatch.internal import InternalCall, InternalRegistry

    reg = InternalRegistry()
    release = threading.Event()
    reg.register("a.block", lambda call: release.wait(60), tenants={"tn_a"})
    reg.register("b.ok", lambda call: None, tenants={"tn_b"})

    def call(n: int) -> InternalCall:
        return InternalCall(f"k{n}", "tr", datetime(2027, 1, 1, tzinfo=UTC), 1, "on-time", "scheduled", 1, {})

    async def scenario() -> tuple[list[str], str]:
        blocked = await asyncio.gather(*(reg.call("a.block", "tn_a", call(i), 0.2) for i in range(40)))
        ok = await reg.call("b.ok", "tn_b", call(99), 1.0)
        return [r.outcome for r in blocked], ok.outcome

    try:
        blocked, ok = asyncio.run(scenario())
    finally:
        release.set()
    assert ok == "delivered", "another tenant's callable found no thread"
    assert set(blocked) <= {"unknown", "retry"} and "unknown" in blocked
