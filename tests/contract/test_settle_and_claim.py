"""Store contract of ``settle_and_claim`` (both engines; decision 0233): the results of finished
attempts and the next claim in one transaction — recorded first, so the claim sees what they free,
and nothing of either durable when either is refused."""

from __future__ import annotations

import dataclasses

import pytest

from fireledger.dispatch.lanes import DispatchConfig
from fireledger.dispatch.runner import _Shaper
from fireledger.dispatch.shaping import Capacity
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire, Policies
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
MARGIN = 5 * S
WIDE = Capacity(1000, {"on-time": 1000, "catch-up": 1000, "backfill": 1000}, 1000)


def _put(store, trig, instants):
    fires = tuple(NewFire(trig.tenant_id, trig.id, us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                          us, "2026f", "t") for us in instants)
    row = store.registry.get_trigger(trig.tenant_id, trig.id)
    [o] = store.timing.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), fires)])
    assert len(o.inserted) == len(instants)


def _shaper():
    return _Shaper(DispatchConfig(), WIDE)


class _Refusing(_Shaper):
    """A shaper whose decision fails: the claim is refused as a whole."""

    def decide(self, snapshot):
        raise RuntimeError("refused")


def _delivered(job):
    return Settlement(job, "delivered", 200, None, "delivered", None, None)


def test_results_are_recorded_before_the_claim_reads_in_flight(store):
    t = add_tenant(store)
    store.dispatch.set_tenant_quota(t.id, inflight=2)
    trig, _, _ = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    _put(store, trig, [T0 + i for i in range(5)])
    now = T0 + S
    first = store.dispatch.claim_shaped(now, "d", {"on-time": 50}, _shaper(), MARGIN)
    assert len(first.jobs) == 2
    # Two in flight fill the quota; settling one in the same transaction frees one slot for the claim.
    oks, res = store.dispatch.settle_and_claim([_delivered(first.jobs[0].job)], now, "d", {"on-time": 50},
                                               _shaper(), MARGIN)
    assert oks == [True]
    assert len(res.jobs) == 1 and res.jobs[0].job.attempt == 1
    done = first.jobs[0].job.fire
    f = store.history.get_fire(FireKey(t.id, trig.id, done.scheduled_us, done.seq))
    assert f.state == "delivered" and [a.result for a in f.attempt_list] == ["delivered"]
    # A result whose lease is gone is refused (compare-and-set), the claim still made; no items: [].
    oks, res = store.dispatch.settle_and_claim([_delivered(first.jobs[0].job)], now, "d", {"on-time": 50},
                                               _shaper(), MARGIN)
    assert oks == [False] and res.jobs == []
    oks, res = store.dispatch.settle_and_claim([], now, "d", {"on-time": 50}, _shaper(), MARGIN)
    assert oks == [] and res.jobs == []


def test_a_refused_claim_records_none_of_the_results(store):
    t = add_tenant(store)
    trig, _, _ = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    _put(store, trig, [T0, T0 + 1])
    now = T0 + S
    [a] = store.dispatch.claim_shaped(now, "d", {"on-time": 1}, _shaper(), MARGIN).jobs
    with pytest.raises(RuntimeError):
        store.dispatch.settle_and_claim([_delivered(a.job)], now, "d", {"on-time": 50},
                                        _Refusing(DispatchConfig(), WIDE), MARGIN)
    f = store.history.get_fire(FireKey(t.id, trig.id, a.job.fire.scheduled_us, a.job.fire.seq))
    assert f.state == "dispatching" and f.attempt_list[0].result is None   # rolled back together
    other = store.history.get_fire(FireKey(t.id, trig.id, T0 + 1, 0))
    assert other.state == "pending" and other.attempts == 0
    # Kept and recorded again later: the lease still holds, so the result is accepted then.
    oks, _ = store.dispatch.settle_and_claim([_delivered(a.job)], now, "d", {"on-time": 50}, _shaper(), MARGIN)
    assert oks == [True]
    assert store.history.get_fire(FireKey(t.id, trig.id, a.job.fire.scheduled_us, a.job.fire.seq)).state == "delivered"


def test_a_claim_describes_each_fire_by_its_own_version_when_versions_are_remembered(store):
    """Decision 0236: a dispatch store remembers the trigger versions its claims read (a committed
    version never changes); a fire of a version written later is still described by that version."""
    t = add_tenant(store)
    trig, v1, _ = add_trigger(store, t, add_target(store, t), {"every": "60s"}, policies=Policies(max_attempts=3))
    _put(store, trig, [T0])
    now = T0 + S
    [a] = store.dispatch.claim_shaped(now, "d", {"on-time": 5}, _shaper(), MARGIN).jobs
    assert (a.job.fire.version, a.job.payload, a.job.policies.max_attempts) == (1, v1.payload, 3)
    v2 = dataclasses.replace(v1, version=2, payload=v1.payload + b"-v2", created_us=T0 + 2 * S,
                             policies=Policies(max_attempts=7))
    assert store.registry.amend_trigger(store.registry.get_trigger(t.id, trig.id), v2, "renamed", None, T0 + 2 * S)
    fires = tuple(NewFire(t.id, trig.id, T0 + 3 * S + i, 0, version, FireKind.SCHEDULED, Lane.ON_TIME,
                          FireState.PENDING, T0, "2026f", "t") for i, version in enumerate((1, 2)))
    store.timing.insert_fires(list(fires))
    got = store.dispatch.claim_shaped(T0 + 10 * S, "d", {"on-time": 5}, _shaper(), MARGIN).jobs
    by_version = {c.job.fire.version: c.job for c in got}
    assert set(by_version) == {1, 2}
    assert (by_version[1].payload, by_version[1].policies.max_attempts) == (v1.payload, 3)
    assert (by_version[2].payload, by_version[2].policies.max_attempts) == (v2.payload, 7)
