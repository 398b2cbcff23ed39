"""The dispatch plane and a dead letter's delivery record (decision 0178): the trigger's next instant
bounds the retries of its fires, not those of a delivery record (it is not the trigger's work: a
trigger firing every second would otherwise leave its dead letters one attempt each); and the body
of a delivery carries the dead fire's history record and the payload, in the documented order."""

from __future__ import annotations

import json
from dataclasses import replace

from fireledger.dispatch.lanes import DispatchConfig
from fireledger.dispatch.settling import _Shaper, dispatch_body, time_to_next_s
from fireledger.dispatch.shaping import Capacity
from fireledger.domain.dispatch_records import ClaimedJob, Settlement
from fireledger.domain.keys import FireKey, dead_letter_key
from fireledger.domain.model import FireKind, FireState, Lane, NewFire, Policies
from fireledger.store import Store
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
WIDE = Capacity(100, {"on-time": 100, "catch-up": 100, "backfill": 100}, 100)


def _claim(store: Store, now_us: int) -> list[ClaimedJob]:
    return list(store.dispatch.claim_shaped(now_us, "node-a", {"on-time": 100, "catch-up": 100},
                                            _Shaper(DispatchConfig(), WIDE), 5 * S).jobs)


def test_a_delivery_record_is_not_bounded_by_the_schedule_and_carries_the_history(store: Store) -> None:
    t = add_tenant(store)
    dlq = add_target(store, t, "http://127.0.0.1:9/dlq")
    trig = add_trigger(store, t, add_target(store, t), {"every": "1s"},
                       policies=Policies(max_attempts=1, dead_letter_target_id=dlq.id))[0]
    store.timing.insert_fires([NewFire(t.id, trig.id, T0, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME,
                                       FireState.PENDING, T0, "2026a", "node-a")])
    [c] = _claim(store, T0)
    assert time_to_next_s(c.job, T0) == 1.0            # the trigger's fire: until its next instant
    assert store.dispatch.settle_dispatch([Settlement(c.job, "failed", 500, None, FireState.FAILED,
                                                      "failed: HTTP 500", None)], T0 + S) == [True]
    [d] = _claim(store, T0 + S)
    assert d.job.target.id == dlq.id
    assert time_to_next_s(d.job, T0 + S) is None        # its delivery: only its own retry policy
    key = str(dead_letter_key(FireKey(t.id, trig.id, T0, 0)))
    body = json.loads(dispatch_body(replace(d.job, payload=b'{"invoice":42}'), key))
    assert list(body) == ["fire_key", "trigger_id", "scheduled_instant", "attempt", "lane", "kind", "version",
                          "dead_letter", "payload"]
    assert (body["fire_key"], body["kind"], body["lane"], body["attempt"]) == (key, "dead-letter", "catch-up", 1)
    assert body["payload"] == {"invoice": 42}
    dead = body["dead_letter"]
    assert dead["key"] == str(FireKey(t.id, trig.id, T0, 0)) and dead["state"] == "failed"
    assert [(a["attempt"], a["http_status"]) for a in dead["attempts"]] == [(1, 500)] and "payload" not in dead


def test_a_delivery_records_story_states_the_default_retry_policy_not_the_triggers(store: Store) -> None:
    """``fireledger why`` / the console fire page (``fire_story``): the dead fire's attempts followed
    the trigger's retry policy; its delivery record's follow the default one (``delivery_policies``)."""
    from fireledger.control.history import fire_story

    t = add_tenant(store)
    dlq = add_target(store, t, "http://127.0.0.1:9/dlq")
    trig, version, _ = add_trigger(store, t, add_target(store, t), {"every": "1h"},
                                   policies=Policies(max_attempts=1, max_event_age_s=30, dead_letter_target_id=dlq.id))
    store.timing.insert_fires([NewFire(t.id, trig.id, T0, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME,
                                       FireState.PENDING, T0, "2026a", "node-a")])
    [c] = _claim(store, T0)
    store.dispatch.settle_dispatch([Settlement(c.job, "failed", 500, None, FireState.FAILED, "failed: HTTP 500",
                                               None)], T0 + S)
    [d] = _claim(store, T0 + S)                               # the delivery's first attempt fails, retryable
    store.dispatch.settle_dispatch([Settlement(d.job, "retry", 503, None, FireState.PENDING, None, T0 + 3 * S)],
                                   T0 + 2 * S)
    dead_key = FireKey(t.id, trig.id, T0, 0)
    dead, record = store.history.get_fire(dead_key), store.history.get_fire(dead_letter_key(dead_key))
    assert dead is not None and record is not None and record.kind == "dead-letter" and record.attempts == 1
    dead_story = [line for _, line in fire_story(dead, trig, version)]
    assert "retry policy of version 1: 1 attempts, backoff 1.00 s doubling to 0:05:00, event age at most 30.00 s, " \
           "never past the next instant" in dead_story, dead_story
    story = [line for _, line in fire_story(record, trig, version)]
    policy = [line for line in story if line.startswith("retry policy of ")]
    default = Policies()
    assert policy == [f"retry policy of a dead-letter delivery (the default, not version 1's): {default.max_attempts} "
                      "attempts, backoff 1.00 s doubling to 0:05:00, no event-age bound, not bounded by the trigger's "
                      "next instant"], story
