"""A dead letter's one delivery to its trigger's dead-letter target (decision 0178), on both engines:
the delivery record is committed with the settlement that ends a fire ``failed`` or ``unknown``
(also when the claim settles it for want of attempts), under the derived key, once whatever
redrives follow; claimed, it goes to the dead-letter target under the default retry policy with the
dead fire and its attempts attached; it never begets another, and it is never an overlap "previous
fire" of its trigger."""

from __future__ import annotations

from typing import Any

from fireledger.dispatch.lanes import DispatchConfig
from fireledger.dispatch.settling import _Shaper
from fireledger.dispatch.shaping import Capacity
from fireledger.domain.dispatch_records import ClaimedJob, Settlement
from fireledger.domain.keys import DEAD_LETTER_SEQ, FireKey, dead_fire_key, dead_letter_key
from fireledger.domain.model import FireKind, FireState, Lane, NewFire, Policies
from fireledger.store import Store
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
WIDE = Capacity(100, {"on-time": 100, "catch-up": 100, "backfill": 100}, 100)
FAIL_FAST = Policies(max_attempts=2, min_backoff_s=1.0, max_backoff_s=1.0)


def _claim(store: Store, now_us: int) -> list[ClaimedJob]:
    res = store.dispatch.claim_shaped(now_us, "node-a", {"on-time": 100, "catch-up": 100},
                                      _Shaper(DispatchConfig(), WIDE), 5 * S)
    return list(res.jobs)


def _settle(store: Store, job: Any, state: FireState, now_us: int, status: int | None = 500,
            cause: str | None = "failed: retries exhausted after 2 attempts (last: HTTP 500)") -> None:
    result = "delivered" if state == FireState.DELIVERED else "failed"
    assert store.dispatch.settle_dispatch(
        [Settlement(job, result, status, None, state, None if state == FireState.DELIVERED else cause, None)],
        now_us) == [True]


def _world(store: Store, policies: Policies) -> tuple[Any, Any, Any, Any, FireKey]:
    t = add_tenant(store)
    main = add_target(store, t, "http://127.0.0.1:9/work")
    dlq = add_target(store, t, "http://127.0.0.1:9/dlq")
    from dataclasses import replace

    trig = add_trigger(store, t, main, {"every": "60s"}, policies=replace(policies, dead_letter_target_id=dlq.id))[0]
    key = FireKey(t.id, trig.id, T0, 0)
    store.timing.insert_fires([NewFire(t.id, trig.id, T0, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                                       T0, "2026a", "node-a")])
    return t, main, dlq, trig, key


def test_a_dead_fire_is_delivered_once_to_its_dead_letter_target(store: Store) -> None:
    t, main, dlq, trig, key = _world(store, FAIL_FAST)
    [c1] = _claim(store, T0)
    assert c1.job.target.id == main.id and c1.job.dead_letter is None
    assert store.dispatch.settle_dispatch([Settlement(c1.job, "retry", 500, None, FireState.PENDING, None,
                                                      T0 + S)], T0) == [True]
    assert store.history.get_fire(dead_letter_key(key)) is None          # not dead yet: no record
    [c2] = _claim(store, T0 + S)
    _settle(store, c2.job, FireState.FAILED, T0 + 2 * S)
    rec = store.history.get_fire(dead_letter_key(key))
    assert rec is not None
    assert (rec.kind, rec.lane, rec.state, rec.seq, rec.version) == ("dead-letter", "catch-up", "pending",
                                                                     DEAD_LETTER_SEQ, 1)
    assert (rec.decided_us, rec.next_attempt_us, rec.decided_by) == (T0 + 2 * S, T0 + 2 * S, "dispatch:dead-letter")
    assert dead_fire_key(dead_letter_key(key)) == key
    [d] = _claim(store, T0 + 2 * S)
    assert d.job.fire.kind == "dead-letter" and d.job.target.id == dlq.id
    assert d.job.policies.max_attempts == Policies().max_attempts            # the default, not fail-fast
    assert d.job.policies.max_backoff_s == Policies().max_backoff_s
    dead = d.job.dead_letter
    assert dead is not None and (dead.seq, dead.state, dead.attempts) == (0, "failed", 2)
    assert [(a.number, a.http_status) for a in dead.attempt_list] == [(1, 500), (2, 500)]
    _settle(store, d.job, FireState.DELIVERED, T0 + 3 * S, status=200)
    # A redrive of the dead fire that dies again records no second delivery (one record per fire).
    assert store.dispatch.redrive_fires([key], T0 + 4 * S, not_before_us=0) == [key]
    [again] = _claim(store, T0 + 4 * S)
    _settle(store, again.job, FireState.FAILED, T0 + 5 * S)
    rec = store.history.get_fire(dead_letter_key(key))
    assert rec is not None and (rec.state, rec.attempts) == ("delivered", 1)
    assert _claim(store, T0 + 6 * S) == []
    assert [f.seq for f in store.history.list_fires(t.id, trig.id)] == [0, DEAD_LETTER_SEQ]


def test_a_delivery_that_dies_begets_none_and_is_itself_a_dead_letter(store: Store) -> None:
    t, _, _, trig, key = _world(store, Policies(max_attempts=1))
    [c] = _claim(store, T0)
    _settle(store, c.job, FireState.FAILED, T0 + S)
    [d] = _claim(store, T0 + S)
    _settle(store, d.job, FireState.FAILED, T0 + 2 * S, cause="failed: HTTP 404 is final")
    assert [(f.seq, f.state) for f in store.history.list_fires(t.id, trig.id)] == [(0, "failed"),
                                                                                 (DEAD_LETTER_SEQ, "failed")]
    assert [f.seq for f in store.dispatch.dead_letters(t.id)] == [0, DEAD_LETTER_SEQ]
    assert _claim(store, T0 + 3 * S) == []
    # Redriven, the delivery record goes to the dead-letter target again, its dead fire attached.
    assert store.dispatch.redrive_fires([dead_letter_key(key)], T0 + 4 * S, not_before_us=0) == [dead_letter_key(key)]
    [d2] = _claim(store, T0 + 4 * S)
    assert d2.job.dead_letter is not None and d2.job.dead_letter.seq == 0 and d2.job.attempt == 2


def test_a_fire_settled_at_the_claim_for_want_of_attempts_records_its_delivery(store: Store) -> None:
    t, _, dlq, trig, key = _world(store, Policies(max_attempts=1))
    [c] = _claim(store, T0)
    # The attempt's lease lapses unrecorded: the next claim settles the fire unknown (no attempt left).
    assert _claim(store, T0 + 60 * S) == []
    f = store.history.get_fire(key)
    assert f is not None and f.state == "unknown"
    rec = store.history.get_fire(dead_letter_key(key))
    assert rec is not None and (rec.state, rec.decided_us) == ("pending", T0 + 60 * S)   # same transaction
    [d] = _claim(store, T0 + 60 * S)
    assert d.job.fire.kind == "dead-letter" and d.job.target.id == dlq.id
    assert d.job.dead_letter is not None and d.job.dead_letter.state == "unknown"
    assert c.job.fire.seq == 0


def test_no_dead_letter_target_no_delivery_and_deliveries_are_not_previous_fires(store: Store) -> None:
    t = add_tenant(store)
    trig = add_trigger(store, t, add_target(store, t), {"every": "60s"}, policies=FAIL_FAST)[0]
    store.timing.insert_fires([NewFire(t.id, trig.id, T0, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME,
                                       FireState.PENDING, T0, "2026a", "node-a")])
    [c] = _claim(store, T0)
    _settle(store, c.job, FireState.FAILED, T0 + S)
    assert [f.seq for f in store.history.list_fires(t.id, trig.id)] == [0]
    # With a dead-letter target: the pending delivery record is not the trigger's previous fire.
    t2, _, _, trig2, key = _world(store, Policies(max_attempts=1))
    [c2] = _claim(store, T0)
    _settle(store, c2.job, FireState.FAILED, T0 + S)
    prev = store.timing.overlap_facts([(t2.id, trig2.id)])[trig2.id].previous
    assert prev is not None and (prev.seq, prev.state) == (key.seq, "failed")
