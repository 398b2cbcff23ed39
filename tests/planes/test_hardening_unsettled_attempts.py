"""Hardening (issue 13, medium #5, dispatch part), class: **an attempt that settles nothing is
re-attempted forever**. Every path out of an attempt records its result with a cause, and the attempt
limit holds when a fire comes round again, not only when a result is recorded.

Members checked: an unexpected exception in the attempt runner (a sender that raises); a lapsed lease
(the runner died or lost the store) on a fire with no attempt left — settled ``unknown`` at claim
time, since that request may have reached the target (invariant 9) — and with attempts left (retried,
its lapsed attempt recorded ``unknown``); a ``KekError`` while opening the payload (a cause, never an
exception out of admission).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from fireledger.clock import FakeClock
from fireledger.dispatch.http import HttpSender
from fireledger.dispatch.lanes import DispatchConfig
from fireledger.dispatch.runner import Dispatcher, _Shaper
from fireledger.dispatch.shaping import Capacity
from fireledger.domain.keys import from_us
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire, Policies
from fireledger.recurrence import format_instant
from fireledger.security import envelope
from fireledger.security.targets import admit
from fireledger.timing import TimingLoop
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
MARGIN = 5 * S
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _shaper() -> _Shaper:
    return _Shaper(DispatchConfig(), Capacity(1000, {"on-time": 1000, "catch-up": 1000, "backfill": 1000}, 1000))


def _one_fire(store, policies: Policies):
    t = add_tenant(store, "a")
    trig, _, _ = add_trigger(store, t, add_target(store, t), {"every": "60s"}, policies=policies)
    fire = NewFire(t.id, trig.id, T0, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING, T0, "2026f", "t")
    row = store.registry.get_trigger(t.id, trig.id)
    [o] = store.timing.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), (fire,))])
    assert len(o.inserted) == 1
    return t, trig


def test_a_lapsed_lease_with_no_attempt_left_is_settled_unknown_at_claim(store) -> None:
    t, trig = _one_fire(store, Policies(timeout_s=1.0, max_attempts=1))
    first = store.dispatch.claim_shaped(T0 + S, "runner-that-dies", {"on-time": 10}, _shaper(), MARGIN)
    assert [c.job.attempt for c in first.jobs] == [1]
    lapsed_at = first.jobs[0].job.lease_expires_us + S
    again = store.dispatch.claim_shaped(lapsed_at, "runner-2", {"on-time": 10}, _shaper(), MARGIN)
    assert again.jobs == [], "a fire with no attempt left was leased again"
    [f] = store.history.list_fires(t.id, trig.id)
    assert f.state == "unknown" and f.attempts == 1 and f.finished_us == lapsed_at
    assert f.cause is not None and "lapsed" in f.cause and "no attempts are left" in f.cause, f.cause
    [a] = f.attempt_list
    assert a.result == "unknown" and a.finished_us == lapsed_at
    # It stays settled: later claims find nothing.
    assert store.dispatch.claim_shaped(lapsed_at + 60 * S, "runner-3", {"on-time": 10}, _shaper(), MARGIN).jobs == []


def test_a_lapsed_lease_with_attempts_left_is_retried_and_its_attempt_recorded_unknown(store) -> None:
    t, trig = _one_fire(store, Policies(timeout_s=1.0, max_attempts=2))
    first = store.dispatch.claim_shaped(T0 + S, "runner-that-dies", {"on-time": 10}, _shaper(), MARGIN)
    lapsed_at = first.jobs[0].job.lease_expires_us + S
    again = store.dispatch.claim_shaped(lapsed_at, "runner-2", {"on-time": 10}, _shaper(), MARGIN)
    assert [c.job.attempt for c in again.jobs] == [2]
    [f] = store.history.list_fires(t.id, trig.id)
    assert f.state == "dispatching" and f.attempts == 2
    one = next(a for a in f.attempt_list if a.number == 1)
    assert one.result == "unknown" and one.finished_us == lapsed_at
    # When that one lapses too, the fire is settled, not leased a third time.
    final_at = again.jobs[0].job.lease_expires_us + S
    assert store.dispatch.claim_shaped(final_at, "runner-3", {"on-time": 10}, _shaper(), MARGIN).jobs == []
    [f] = store.history.list_fires(t.id, trig.id)
    assert f.state == "unknown" and f.attempts == 2


def test_an_unexpected_error_in_an_attempt_settles_it_with_a_cause(store) -> None:
    """A broken part of the runner (here a sender that was closed: it raises ``RuntimeError``) used to
    be logged and nothing settled; the lease lapsed and the fire was attempted again, past its limit."""
    clock = FakeClock(T0)
    t = add_tenant(store)
    tg = add_target(store, t, url="http://127.0.0.1:9/hook", secret=SECRET)
    at = {"at": format_instant(from_us(T0 + S))}
    trig, _, first = add_trigger(store, t, tg, at, policies=Policies(timeout_s=1.0, max_attempts=2))
    assert first is not None
    clock.set(first)
    assert len(TimingLoop(store, clock, "t1").tick().inserted) == 1
    sender = HttpSender()
    asyncio.run(sender.close())

    async def steps() -> tuple[int, int, int]:
        async with Dispatcher(store, clock, "d1", sender=sender) as d:
            started, recorded = await d.claim_once(), await d.flush()
            # Without the fix nothing is recorded and the fire is re-leased when its lease lapses
            # (timeout + margin, 6 s), for ever: a minute later it would be claimed again.
            clock.set(first + 60 * S)
            return started, recorded, await d.claim_once()

    assert asyncio.run(steps()) == (1, 1, 0)
    [f] = store.history.list_fires(t.id, trig.id)
    assert f.state == "failed" and f.attempts == 1
    assert f.cause is not None and "RuntimeError" in f.cause and "not sent" in f.cause, f.cause
    assert f.attempt_list[0].finished_us is not None and f.attempt_list[0].result == "failed"


def test_a_kek_error_in_admission_is_a_recorded_cause(store, monkeypatch) -> None:
    """The payload was sealed under the deployment's KEK; this process holds another. Admission says why it will
    not send (no path, no key material), instead of raising out of the attempt."""
    t = add_tenant(store)
    trig, _, _ = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    fire = NewFire(t.id, trig.id, T0, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING, T0, "2026f", "t")
    row = store.registry.get_trigger(t.id, trig.id)
    store.timing.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), (fire,))])
    sealed = envelope.cipher_for(store).seal(t.id, trig.id, 1, json.dumps({"n": 1}).encode())
    [claimed] = store.dispatch.claim_shaped(T0 + S, "d", {"on-time": 10}, _shaper(), MARGIN).jobs
    job = replace(claimed.job, payload=sealed)
    # This process's cipher for the store: another KEK (as after a wrong FIRELEDGER_KEK).
    monkeypatch.setitem(envelope._CIPHERS, store, envelope.PayloadCipher(store, bytes(range(1, 33))))
    got, cause = asyncio.run(admit(store, job, T0 + S))
    assert cause is not None and cause.startswith("not sent:") and "KekError" in cause, cause
    assert got.payload == sealed   # nothing opened
    assert "/" not in cause.removeprefix("not sent:"), "a file path in a tenant-visible cause"
