"""Pause and resume with their audit row (decision 0180), on both engines: the row is appended in the
transaction of the act, names the actor and the state before and after, and a pause or resume that
loses its compare-and-set writes no row; the registry writes one only for a named actor."""

from __future__ import annotations

from fireledger.domain.model import TriggerState
from fireledger.domain.trust_records import AuditNote
from fireledger.registry import Registry
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000


def _actions(store, tenant_id: str) -> list[tuple[str, str]]:
    return [(e.actor, e.action) for e in store.trust.audit_rows(tenant_id=tenant_id)]


def test_the_store_appends_the_audit_row_with_the_pause_and_the_resume_only(store):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    assert first is not None
    cur = store.registry.get_trigger(t.id, trig.id)
    note = AuditNote(t.id, "pr_alice", "trigger.pause", first - 10 * S, {"state": "active"}, {"state": "paused"})
    assert store.registry.pause_trigger(cur, first - 10 * S, audit=note) == first - 10 * S
    assert _actions(store, t.id)[-1] == ("pr_alice", "trigger.pause")
    rows = len(_actions(store, t.id))
    # Lost compare-and-set (not active any more): nothing written, no audit row.
    assert store.registry.pause_trigger(cur, first, audit=note) is None
    paused = store.registry.get_trigger(t.id, trig.id)
    resumed = AuditNote(t.id, "pr_alice", "trigger.resume", first, {"state": "paused"}, {"state": "active"})
    assert not store.registry.resume_trigger(paused, first - 11 * S, first, first, audit=resumed)   # stale point
    assert len(_actions(store, t.id)) == rows
    assert store.registry.resume_trigger(paused, first - 10 * S, first, first, audit=resumed)
    assert _actions(store, t.id)[-1] == ("pr_alice", "trigger.resume")
    assert store.registry.get_trigger(t.id, trig.id).state == TriggerState.ACTIVE


def test_the_registry_audits_a_pause_and_resume_for_an_actor_only(store):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    assert first is not None
    reg = Registry(store)
    reg.pause(t.id, trig.id, now_us=first - 10 * S)
    reg.resume(t.id, trig.id, now_us=first - 5 * S)
    assert [a for _, a in _actions(store, t.id) if a.startswith("trigger.")] == []
    reg.pause(t.id, trig.id, now_us=first - 4 * S, actor="pr_bob")
    reg.resume(t.id, trig.id, now_us=first - 3 * S, actor="pr_bob")
    rows = [e for e in store.trust.audit_rows(tenant_id=t.id) if e.action.startswith("trigger.")]
    assert [(e.actor, e.action, e.at_us) for e in rows] == [("pr_bob", "trigger.pause", first - 4 * S),
                                                           ("pr_bob", "trigger.resume", first - 3 * S)]
    assert rows[0].as_json()["prior"] == {"trigger_id": trig.id, "state": "active"}
    assert rows[1].as_json()["new"] == {"trigger_id": trig.id, "state": "active"}
