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
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.keys import from_us
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire, Policies
from fireledger.recurrence import format_instant
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
    res = store.dispatch.claim_shaped(first + S, "d", {"on-time": 10}, _shaper(), 5 * S)
    [claimed] = [c for c in res.jobs if c.job.fire.trigger_id == trig.id]
    return claimed.job


def _shaper() -> _Shaper:
    return _Shaper(DispatchConfig(), Capacity(1000, {"on-time": 1000, "catch-up": 1000, "backfill": 1000}, 1000))


def _put(store: Any, trig: Any, instants: list[int]) -> None:
    fires = tuple(NewFire(trig.tenant_id, trig.id, us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                          us, "2026f", "t") for us in instants)
    row = store.registry.get_trigger(trig.tenant_id, trig.id)
    [o] = store.timing.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), fires)])
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
    res = store.dispatch.claim_shaped(T0 + 10 * S, "d", {"on-time": 10}, _shaper(), 5 * S)
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
    oks = store.dispatch.settle_dispatch(batch, now)
    assert oks == [True, False, True]
    got = {f.scheduled_us: f for f in store.history.list_fires(t.id, trig.id)}
    a, b, c = (got[j.fire.scheduled_us] for j in jobs)
    assert a.state == "pending" and a.next_attempt_us is not None and a.next_attempt_us <= LATEST_US
    assert b.state == "failed" and b.cause is not None
    assert "could not be recorded" in b.cause and ("Overflow" in b.cause or "OutOfRange" in b.cause), b.cause
    assert b.attempt_list[0].finished_us == now and b.attempt_list[0].http_status is None
    assert c.state == "delivered" and c.attempt_list[0].http_status == 204
    # The next batch is recorded as usual (nothing was left behind to poison it).
    res = store.dispatch.claim_shaped(LATEST_US, "d", {"on-time": 10}, _shaper(), 5 * S)
    assert [j.job.fire.scheduled_us for j in res.jobs] == [jobs[0].fire.scheduled_us]
    assert store.dispatch.settle_dispatch([Settlement(res.jobs[0].job, "delivered", 200, None, "delivered", None,
                                                      None)],
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
            fs = store.history.list_fires(a.id, one_shot.id)
            return bool(fs) and bool(fs[0].attempt_list) and fs[0].attempt_list[0].finished_us is not None

        try:
            wait_until(lambda: any(r["path"].startswith("/retry-after") for r in sink.records()), 15,
                       "the poisoned target's 503")
            poisoned_at = clock.now().latest_us
            wait_until(poisoned_recorded, 10, "the 503 with an absurd Retry-After to be recorded")

            def delivered_since() -> bool:
                return all(sum(1 for f in store.history.list_fires(b.id, t.id)
                               if f.state == "delivered" and f.scheduled_us > poisoned_at) >= 3 for t in mine)

            wait_until(delivered_since, 20, "the other tenant's fires delivered and recorded after the 503")
        finally:
            stopped = planes.stop(15)
        assert stopped, "the dispatcher did not return within 15 s of stop()"
        assert planes.error is None, planes.error
        [f] = store.history.list_fires(a.id, one_shot.id)
        assert f.state == "pending" and f.attempt_list[0].http_status == 503
        assert f.next_attempt_us is not None and f.next_attempt_us <= poisoned_at + int((ONE_HOUR_S + 30) * S)
        later = clock.now().latest_us
        stuck = [g for t in mine for g in store.history.list_fires(b.id, t.id)
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


# --- a response head without end (red team, decision 0092) --------------------------------------

ENDLESS_HEADS = {
    "one-endless-header": (b"HTTP/1.1 200 OK\r\nX-A: ", b"a" * 65536),
    "many-headers": (b"HTTP/1.1 200 OK\r\n", b"".join(b"X-%d: v\r\n" % i for i in range(4000))),
    "endless-interim-heads": (b"", b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n" * 1000),
    "endless-status-line": (b"HTTP/1.1 200 ", b"O" * 65536),
}


@pytest.mark.parametrize("kind", list(ENDLESS_HEADS))
def test_a_response_head_without_end_is_cut_at_its_cap_not_read_to_the_deadline(kind: str) -> None:
    """A target answering a head that never ends (one header growing without end, endless headers,
    endless interim responses) made the dispatch process buffer all of it until the attempt's
    deadline — up to 15 minutes of whatever the target could send, in the memory every tenant's
    attempts share. The head is capped (``RESPONSE_HEAD_MAX_BYTES``): the attempt ends at once as a
    retry naming the cause, and the target could write only a bounded amount before it was cut off."""
    from fireledger.dispatch.http import HttpRequest, HttpSender
    from fireledger.dispatch.wire import RESPONSE_HEAD_MAX_BYTES

    start, chunk = ENDLESS_HEADS[kind]
    written = {"bytes": 0}

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(start)
        try:
            while written["bytes"] < 2_000 * 1024 * 1024:
                writer.write(chunk)
                await writer.drain()
                written["bytes"] += len(chunk)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def main() -> HttpResult:
        server = await asyncio.start_server(endless, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with HttpSender() as sender:   # private targets allowed by tests/conftest.py
                return await sender.send(HttpRequest(
                    url=f"http://127.0.0.1:{port}/hook", secret=SECRET, fire_key="fk1", msg_id="fk1:1",
                    timestamp=1_900_000_000, body=b"{}", timeout_s=20.0))
        finally:
            server.close()

    t0 = time.monotonic()
    res = asyncio.run(main())
    assert time.monotonic() - t0 < 10, "the head was read until the deadline"
    assert res.outcome == "retry" and res.http_status is None, res
    assert f"larger than {RESPONSE_HEAD_MAX_BYTES} bytes" in (res.error or ""), res.error
    assert written["bytes"] < 32 * 1024 * 1024, written   # the client stopped reading almost at once


# --- a tenant's huge catch-up (red team, decision 0093) ------------------------------------------


def _every_second(after: int) -> int:
    return (after // S + 1) * S


@pytest.mark.parametrize("policy", ["fire-all", "fire-once-now", "skip"])
def test_one_plan_of_a_huge_catch_up_is_bounded_and_the_slices_decide_every_instant_once(policy: str) -> None:
    """An every-second trigger with a 24 h horizon after a 48 h gap (a pause, an outage): one plan
    enumerated and recorded all 86,401 instants of the horizon — seconds of CPU and one transaction of
    86,401 fires, during which no other tenant's fire was decided. Each plan now covers at most
    2 × ENUMERATION_CAP instants; the row stays due at the first undecided one; followed to the end,
    the slices decide every instant once, exactly as the policy says for the whole gap."""
    from fireledger.domain.model import DueRow, MissedFirePolicy
    from fireledger.domain.policies import ENUMERATION_CAP, PlanContext, plan_due

    earliest = T0 + 48 * 3600 * S
    ctx = PlanContext(earliest_us=earliest, decided_by="n", tzdata_version="x")
    pol = Policies(missed_fire=MissedFirePolicy(policy), catchup_horizon_s=86400)
    row = DueRow("tr_flood", "tn_1", 0, T0, 1)
    decided: list[NewFire] = []
    plans = 0
    while True:
        t0 = time.thread_time()   # CPU of this thread: other work on the machine does not count
        d = plan_due(row, _every_second, pol, ctx)
        assert time.thread_time() - t0 < 1.0   # the whole horizon in one plan took seconds of CPU
        plans += 1
        assert len(d.fires) <= 2 * ENUMERATION_CAP + 1, len(d.fires)
        decided.extend(d.fires)
        nxt = d.advance.new_next_us
        assert nxt is not None
        if nxt > earliest:
            break
        assert nxt > row.next_us
        row = DueRow("tr_flood", "tn_1", 0, nxt, 1)
    assert plans > 1
    instants = [f.scheduled_us for f in decided]
    assert instants == sorted(set(instants))            # never one instant twice
    pending = [f.scheduled_us for f in decided if f.state == FireState.PENDING]
    on_time = list(range(earliest - 60 * S, earliest + 1, S))   # lateness ≤ the 60 s miss threshold
    if policy == "fire-all":   # each instant of the horizon fired once
        assert pending == list(range(earliest - 86400 * S, earliest + 1, S))
    else:                      # the on-time ones only (fire-once-now: none missed is fired then)
        assert pending == on_time
        assert len(decided) <= plans * 200   # the non-dispatch record stays collapsed per plan


def _fire_counts(store, trigger_id: str) -> tuple[int, int, int]:
    """(fires, distinct instants, pending) of one trigger, read with one query."""
    with store.engine.read() as c:
        row = c.execute("SELECT COUNT(*), COUNT(DISTINCT scheduled_us), "
                        "SUM(CASE WHEN state = 'pending' THEN 1 ELSE 0 END) "
                        f"FROM fires WHERE trigger_id = '{trigger_id}'").fetchone()
    return int(row[0]), int(row[1]), int(row[2] or 0)


def test_a_huge_catch_up_does_not_hold_the_timing_plane_for_another_tenant(store) -> None:
    """With the real timing loop and store: one tenant's every-second ``fire-all`` trigger, 24 h
    behind, and another tenant's minute trigger due now. Each tick commits a bounded slice; the
    other tenant's instant is decided on the first tick; the flood is fully decided over the next."""
    from fireledger.clock import FakeClock
    from fireledger.domain.model import MissedFirePolicy
    from fireledger.domain.policies import ENUMERATION_CAP

    now = T0 + 24 * 3600 * S + 30 * S
    a = add_tenant(store, "flooder", now_us=T0)
    b = add_tenant(store, "bystander", now_us=T0)
    ta, tb = add_target(store, a, now_us=T0), add_target(store, b, now_us=T0)
    flood, _, _ = add_trigger(store, a, ta, {"every": "1s"}, now_us=T0,
                              policies=Policies(missed_fire=MissedFirePolicy.FIRE_ALL, catchup_horizon_s=86400))
    calm, _, first = add_trigger(store, b, tb, {"cron": "* * * * *"}, now_us=now - 31 * S)
    clock = FakeClock(now, eps_us=1_000)
    loop = TimingLoop(store, clock, "t1")
    loop.tick()
    assert [f.scheduled_us for f in store.history.list_fires(b.id, calm.id)] == [first]   # decided on the first tick
    n, _, _ = _fire_counts(store, flood.id)
    assert 0 < n <= 2 * ENUMERATION_CAP + 1, n           # one bounded slice, not the whole day
    ticks = 1
    while any(r.trigger_id == flood.id for r in store.timing.due_rows(clock.now().earliest_us, 10)):
        assert ticks < 200, "the catch-up never finished"
        loop.tick()
        ticks += 1
    n, distinct, pending = _fire_counts(store, flood.id)
    earliest = clock.now().earliest_us
    in_horizon = earliest // S + (86400 * S - earliest) // S + 1   # whole seconds in [earliest - 24 h, earliest]
    assert n == distinct and pending == in_horizon and ticks > 1
