"""The dispatch area's dead letters and redrive (decision 0148) on both engines: the list's order,
filters (trigger, window, cause contained — literally and case-sensitively) and cursor; a redrive's
compare-and-set (dead, within retention), what it records on the fire, and its audit row committed
with it (none when nothing was redriven)."""

from __future__ import annotations

from fireledger.domain.keys import FireKey
from fireledger.domain.model import FireKind, FireState, Lane, NewFire
from fireledger.domain.trust_records import AuditNote
from fireledger.store import Store
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000


def _fire(tenant_id: str, trigger_id: str, at: int, state: FireState, cause: str | None) -> NewFire:
    return NewFire(tenant_id, trigger_id, at, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, state, at + 1000,
                   "2026a", "node-a", cause=cause)


def test_dead_letters_are_ordered_filtered_and_paged(store: Store) -> None:
    t = add_tenant(store)
    other = add_tenant(store, "other")
    tg = add_target(store, t)
    a, b = (add_trigger(store, t, tg, {"every": "60s"})[0].id for _ in range(2))
    o = add_trigger(store, other, add_target(store, other), {"every": "60s"})[0].id
    fires = [_fire(t.id, a, T0 - 30 * S, FireState.FAILED, "failed: HTTP 404 is final"),
             _fire(t.id, b, T0 - 20 * S, FireState.UNKNOWN, "unknown: no answer within 30s and no attempts left"),
             _fire(t.id, a, T0 - 20 * S, FireState.FAILED, "failed: retries exhausted after 8 attempts"),
             _fire(t.id, a, T0 - 10 * S, FireState.DELIVERED, None),
             _fire(t.id, a, T0 - 5 * S, FireState.SKIPPED, "skipped: missed; missed-fire policy is skip"),
             _fire(other.id, o, T0 - 20 * S, FireState.FAILED, "failed: HTTP 404 is final")]
    store.timing.insert_fires(fires)
    dl = store.dispatch.dead_letters
    ta, tb = sorted([a, b])
    got = [(f.scheduled_us, f.trigger_id) for f in dl(t.id)]
    assert got == [(T0 - 30 * S, a), (T0 - 20 * S, ta), (T0 - 20 * S, tb)]
    assert {f.state for f in dl(t.id)} == {"failed", "unknown"}
    assert [f.trigger_id for f in dl(t.id, trigger_id=b)] == [b]
    assert [f.scheduled_us for f in dl(t.id, from_us=T0 - 20 * S, to_us=T0 - 19 * S)] == [T0 - 20 * S] * 2
    assert [f.cause for f in dl(t.id, cause="HTTP 404")] == ["failed: HTTP 404 is final"]
    assert dl(t.id, cause="http 404") == [] and dl(t.id, cause="%") == []      # literal, case-sensitive
    page1 = dl(t.id, limit=2)
    last = page1[-1]
    page2 = dl(t.id, after=(last.scheduled_us, last.trigger_id, last.seq), limit=2)
    assert [(f.scheduled_us, f.trigger_id) for f in page1 + page2] == got


def test_a_redrive_is_a_compare_and_set_with_its_audit_row(store: Store) -> None:
    t = add_tenant(store)
    trig = add_trigger(store, t, add_target(store, t), {"every": "60s"})[0]
    store.timing.insert_fires([_fire(t.id, trig.id, T0 - 20 * S, FireState.FAILED, "failed: HTTP 500"),
                               _fire(t.id, trig.id, T0 - 10 * S, FireState.DELIVERED, None)])
    dead, done = FireKey(t.id, trig.id, T0 - 20 * S), FireKey(t.id, trig.id, T0 - 10 * S)
    audits = len(store.trust.audit_rows(tenant_id=t.id))
    note = AuditNote(t.id, "pr_x", "fire.redrive", T0, None, {"n": 1})
    # Past retention, not dead, no such fire: nothing redriven, nothing written, no audit row.
    assert store.dispatch.redrive_fires([dead], T0, not_before_us=T0 - 15 * S, audit=note) == []
    assert store.dispatch.redrive_fires([done, FireKey(t.id, trig.id, T0)], T0, not_before_us=0, audit=note) == []
    assert len(store.trust.audit_rows(tenant_id=t.id)) == audits
    assert store.dispatch.redrive_fires([done, dead], T0, not_before_us=0, audit=note) == [dead]
    [row] = store.trust.audit_rows(tenant_id=t.id)[audits:]
    assert (row.action, row.actor, row.at_us) == ("fire.redrive", "pr_x", T0)
    f = store.history.get_fire(dead)
    assert f is not None and (f.state, f.cause, f.next_attempt_us, f.finished_us) == ("pending", None, T0, None)
    assert (f.attempt_base, f.redriven_us) == (f.attempts, T0)
    assert store.dispatch.dead_letters(t.id) == []
    assert store.dispatch.redrive_fires([dead], T0 + S, not_before_us=0) == []      # pending now: not dead
