"""The store contract: every test runs against real SQLite and a real PostgreSQL server.

A store change extends this suite; both engines must pass it unchanged.
"""

from __future__ import annotations

import dataclasses

import pytest

from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.keys import FireKey
from fireledger.domain.model import (
    Advance,
    Decision,
    FireKind,
    FireState,
    Lane,
    NewFire,
    TriggerState,
)
from fireledger.store import SchemaError, Store
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000


def fire_for(trig, scheduled_us, *, node="n1", state=FireState.PENDING, seq=0):
    return NewFire(trig.tenant_id, trig.id, scheduled_us, seq, 1, FireKind.SCHEDULED, Lane.ON_TIME, state,
                   scheduled_us + 5, "2026f", node)


def decision(trig, due_us, new_us, fires):
    return Decision(Advance(trig.id, due_us, 1, new_us, 1), tuple(fires))


def test_migrations_are_idempotent_and_checked(store):
    assert store.migrate() == []
    store.check_schema()
    assert store.schema_version() >= 1


def test_postgres_refuses_an_unmigrated_database(pg_server):
    url = pg_server.new_database()
    with pytest.raises(SchemaError, match="fireledger db upgrade"):
        Store.open(url)
    s = Store.open(url, migrate=True)
    s.close()
    Store.open(url).close()


def test_tenant_principal_lookup_by_token_hash(store):
    t = add_tenant(store)
    [p] = [store.trust.principal_by_token_hash(f"hash-{pid}") for pid in _principal_ids(store, t)]
    assert p.tenant_id == t.id and "author" in p.roles
    assert store.trust.principal_by_token_hash("nope") is None


def _principal_ids(store, tenant):
    with store.engine.read() as c:
        q = "SELECT id FROM principals WHERE tenant_id = " + ("?" if store.engine_name == "sqlite" else "%s")
        return [r[0] for r in c.execute(q, (tenant.id,)).fetchall()]


def test_create_trigger_writes_one_due_row(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, v, first = add_trigger(store, t, tg, {"cron": "*/5 * * * *"})
    got = store.registry.get_trigger(t.id, trig.id)
    assert got.next_us == first and first > T0
    assert [r.trigger_id for r in store.timing.due_rows(first, 10)] == [trig.id]
    assert store.timing.due_rows(first - 1, 10) == []
    assert store.timing.earliest_due() == first
    assert store.registry.get_version(trig.id, 1).schedule == v.schedule


def test_two_deciders_of_one_instant_yield_one_fire(store):
    """Invariant 2: the second decider collides on the primary key and treats it as normal."""
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    d_a = decision(trig, first, first + 60 * S, [fire_for(trig, first, node="a")])
    d_b = decision(trig, first, first + 60 * S, [fire_for(trig, first, node="b")])
    [oa] = store.timing.apply_decisions([d_a])
    [ob] = store.timing.apply_decisions([d_b])
    assert oa.advanced and len(oa.inserted) == 1
    assert not ob.advanced and ob.inserted == ()
    fires = store.history.list_fires(t.id, trig.id)
    assert len(fires) == 1 and fires[0].decided_by == "a"


def test_primary_key_conflict_is_a_normal_return_even_when_the_row_still_matches(store):
    """A fire already decided elsewhere (same key) inserts nothing; the advance still applies."""
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    # Someone else committed the fire but (say) crashed before its advance was visible.
    store.timing.apply_decisions([Decision(Advance(trig.id, first, 1, first, 1), (fire_for(trig, first, node="a"),))])
    [o] = store.timing.apply_decisions([decision(trig, first, first + 60 * S, [fire_for(trig, first, node="b")])])
    assert o.advanced and o.inserted == ()
    assert [f.decided_by for f in store.history.list_fires(t.id, trig.id)] == ["a"]


def test_stale_decision_inserts_nothing(store):
    """A decision against a due row that moved (amend/pause meanwhile) leaves no fire behind."""
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    [o] = store.timing.apply_decisions([decision(trig, first - 1, first + 60 * S, [fire_for(trig, first - 1)])])
    assert not o.advanced and o.inserted == ()
    assert store.history.list_fires(t.id, trig.id) == []
    assert store.registry.get_trigger(t.id, trig.id).next_us == first


def test_a_failed_commit_leaves_nothing(store, monkeypatch):
    """Invariant 1 (store side): if the transaction fails, neither fire nor advance exists."""
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    bad = decision(trig, first, first + 60 * S, [fire_for(trig, first), fire_for(trig, first, seq=1)])
    # Poison the second fire so the transaction fails after the first insert ran.
    poisoned = dataclasses.replace(bad, fires=(bad.fires[0], dataclasses.replace(bad.fires[1], kind=None)))
    with pytest.raises(Exception):  # noqa: B017 - any engine error
        store.timing.apply_decisions([poisoned])
    assert store.history.list_fires(t.id, trig.id) == []
    assert store.registry.get_trigger(t.id, trig.id).next_us == first


def test_retiring_the_due_row(store):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"at": "2030-01-01T00:00:00Z"})
    [o] = store.timing.apply_decisions([decision(trig, first, None, [fire_for(trig, first)])])
    assert o.advanced and store.registry.get_trigger(t.id, trig.id).next_us is None
    assert store.timing.earliest_due() is None


def test_dispatch_claim_lease_and_settle(store):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    store.timing.apply_decisions([decision(trig, first, first + 60 * S, [fire_for(trig, first)])])
    now = first + 10
    assert store.dispatch.claim_dispatch("catch-up", now, 10, "d1", 30 * S) == []
    [job] = store.dispatch.claim_dispatch("on-time", now, 10, "d1", 30 * S)
    assert job.attempt == 1 and job.target.url and job.fire.state == "dispatching"
    assert store.dispatch.claim_dispatch("on-time", now, 10, "d2", 30 * S) == []          # leased
    # The lease expires: another runner takes it as attempt 2 under the same key.
    [job2] = store.dispatch.claim_dispatch("on-time", now + 31 * S, 10, "d2", 30 * S)
    assert job2.attempt == 2 and job2.lease_owner == "d2"
    # The first runner's late result loses the compare-and-set.
    late = Settlement(job, "delivered", 200, None, "delivered", None, None)
    assert store.dispatch.settle_attempts([late], now + 32 * S) == [False]
    ok = Settlement(job2, "delivered", 200, None, "delivered", None, None)
    assert store.dispatch.settle_attempts([ok], now + 33 * S) == [True]
    f = store.history.get_fire(FireKey(t.id, trig.id, first, 0))
    assert f.state == "delivered" and f.attempts == 2
    assert [(a.number, a.result) for a in f.attempt_list] == [(1, "delivered"), (2, "delivered")]
    assert store.dispatch.claim_dispatch("on-time", now + 100 * S, 10, "d3", 30 * S) == []


def test_retry_returns_fire_to_pending_until_its_time(store):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    store.timing.apply_decisions([decision(trig, first, first + 60 * S, [fire_for(trig, first)])])
    [job] = store.dispatch.claim_dispatch("on-time", first + 10, 10, "d1", 30 * S)
    retry = Settlement(job, "retry", 503, None, "pending", None, first + 5 * S)
    assert store.dispatch.settle_attempts([retry], first + 1) == [True]
    assert store.dispatch.claim_dispatch("on-time", first + 4 * S, 10, "d1", 30 * S) == []
    [again] = store.dispatch.claim_dispatch("on-time", first + 5 * S, 10, "d1", 30 * S)
    assert again.attempt == 2


def test_claims_are_shared_without_double_claiming(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    decisions = []
    for _ in range(20):
        trig, _, first = add_trigger(store, t, tg, {"every": "60s"})
        decisions.append(decision(trig, first, first + 60 * S, [fire_for(trig, first)]))
    store.timing.apply_decisions(decisions)
    now = T0 + 120 * S
    a = store.dispatch.claim_dispatch("on-time", now, 7, "a", 30 * S)
    b = store.dispatch.claim_dispatch("on-time", now, 100, "b", 30 * S)
    keys_a = {(j.fire.trigger_id, j.fire.scheduled_us) for j in a}
    keys_b = {(j.fire.trigger_id, j.fire.scheduled_us) for j in b}
    assert len(a) == 7 and len(b) == 13 and not keys_a & keys_b


def test_amend_pause_resume_move_the_due_row_at_once(store):
    """Invariant 5: one next instant per trigger, recomputed from the current version."""
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, v, first = add_trigger(store, t, tg, {"every": "60s"})
    v2 = dataclasses.replace(v, version=2, schedule={**v.schedule, "every": "30s"})
    assert store.registry.amend_trigger(trig, v2, trig.name, first - 30 * S, T0 + 1)
    got = store.registry.get_trigger(t.id, trig.id)
    assert got.current_version == 2 and got.next_us == first - 30 * S
    assert [(r.next_us, r.version) for r in store.timing.due_rows(first, 10)] == [(first - 30 * S, 2)]
    # A second amend against the old version loses the compare-and-set.
    assert not store.registry.amend_trigger(trig, dataclasses.replace(v2, version=3), trig.name, first, T0 + 2)
    assert store.registry.set_trigger_state(got, TriggerState.PAUSED, None, T0 + 3)
    assert store.timing.due_rows(first * 2, 10) == [] and store.registry.get_trigger(t.id, trig.id).next_us is None
    paused = store.registry.get_trigger(t.id, trig.id)
    assert store.registry.set_trigger_state(paused, TriggerState.ACTIVE, first + 90 * S, T0 + 4)
    assert store.registry.get_trigger(t.id, trig.id).next_us == first + 90 * S
    before = store.registry.definitions_counter()
    assert store.registry.set_trigger_state(store.registry.get_trigger(t.id, trig.id), TriggerState.DELETED, None,
                                            T0 + 5)
    assert store.registry.get_trigger(t.id, trig.id) is None and store.registry.definitions_counter() == before + 1


def test_history_pages_oldest_first_with_attempts(store):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    due = first
    for i in range(5):
        store.timing.apply_decisions([decision(trig, due, due + 60 * S, [fire_for(trig, due)])])
        due += 60 * S
        if i == 1:
            [job] = store.dispatch.claim_dispatch("on-time", due, 1, "d", 30 * S)
            store.dispatch.settle_attempts([Settlement(job, "failed", 404, None, "failed", "failed: HTTP 404 is final",
                                              None)], due)
    page1 = store.history.list_fires(t.id, trig.id, None, 3)
    page2 = store.history.list_fires(t.id, trig.id, (page1[-1].scheduled_us, page1[-1].seq), 3)
    got = [f.scheduled_us for f in page1 + page2]
    assert got == sorted(got) and len(got) == 5
    failed = [f for f in page1 + page2 if f.state == "failed"]
    assert len(failed) == 1 and failed[0].cause == "failed: HTTP 404 is final"
    assert failed[0].attempt_list[0].http_status == 404
    other = add_tenant(store, "other")
    assert store.history.list_fires(other.id, trig.id) == []
