"""Store contract of the trust boundary (audit chain, principals, verification, tenant keys, deletion
and purge): every test runs against real SQLite and a real PostgreSQL server."""

from __future__ import annotations

import pytest

from fireledger.domain.keys import new_id
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire, Principal
from fireledger.domain.trust_records import GENESIS_HASH, chain_mac
from fireledger.security.auditlog import verify_chain
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000


def _execute(store, sql):
    """Raw SQL as an attacker (or a careless operator) with database access would run it."""
    with store.engine.write() as c:
        return c.execute(sql)


def test_audit_rows_chain_from_genesis_and_the_head_follows(store):
    a = store.trust.append_audit("tn_a", "pr_1", "target.create", T0, None, {"url": "https://x.example"})
    b = store.trust.append_audit(None, "operator", "tenant.delete", T0 + 1, {"x": [1, 2]}, None)
    assert (a.seq, b.seq) == (1, 2) and a.prev_hash == GENESIS_HASH and b.prev_hash == a.hash
    assert a.hash == chain_mac(store.trust.audit_key, 1, "tn_a", "pr_1", "target.create", T0, None,
                               '{"url":"https://x.example"}', GENESIS_HASH)   # keyed (decision 0090)
    assert store.trust.audit_head() == (2, b.hash)
    assert [r.seq for r in store.trust.audit_rows()] == [1, 2]
    assert [r.seq for r in store.trust.audit_rows(tenant_id="tn_a")] == [1]
    assert store.trust.audit_rows(after_seq=1)[0].as_json()["prior"] == {"x": [1, 2]}
    assert verify_chain(store).ok


def test_audit_table_refuses_update_and_delete(store):
    store.trust.append_audit(None, "operator", "x", T0)
    for sql in ("UPDATE audit SET actor = 'someone else'", "DELETE FROM audit"):
        with pytest.raises(Exception, match="append-only"):
            _execute(store, sql)
    assert [r.actor for r in store.trust.audit_rows()] == ["operator"]


def test_principals_create_list_revoke_and_last_admin_is_kept(store):
    t = add_tenant(store)
    admin = Principal(new_id("pr"), t.id, "root", frozenset({"admin", "reader"}), T0)
    store.trust.create_principal_audited(admin, "h-admin", "operator")
    bob = Principal(new_id("pr"), t.id, "bob", frozenset({"author"}), T0)
    store.trust.create_principal_audited(bob, "h-bob", admin.id)
    ids = [p.id for p in store.trust.list_principals(t.id)]
    assert admin.id in ids and bob.id in ids and store.trust.count_principals(t.id) == 3   # + storekit's root
    assert store.trust.get_principal(t.id, bob.id).roles == frozenset({"author"})
    other = add_tenant(store)
    assert store.trust.get_principal(other.id, bob.id) is None
    assert store.trust.revoke_principal(other.id, bob.id, "x", T0) == "absent"
    assert store.trust.revoke_principal(t.id, bob.id, admin.id, T0 + 5) == "revoked"
    assert store.trust.principal_by_token_hash("h-bob") is None
    assert store.trust.get_principal(t.id, bob.id).revoked_us == T0 + 5
    assert store.trust.revoke_principal(t.id, bob.id, admin.id, T0 + 6) == "absent"
    assert store.trust.revoke_principal(t.id, admin.id, admin.id, T0 + 7) == "last-admin"
    assert store.trust.principal_by_token_hash("h-admin") is not None
    actions = [(r.action, r.actor) for r in store.trust.audit_rows(tenant_id=t.id)]
    assert actions == [("principal.create", "operator"), ("principal.create", admin.id),
                       ("principal.revoke", admin.id)]


def test_target_verification_state_is_recorded_and_audited(store):
    t = add_tenant(store)
    tg = add_target(store, t, verification="unverified")
    assert store.trust.target_trust(tg.id).state == "unverified"
    other = add_tenant(store)
    assert not store.trust.set_target_verification(other.id, tg.id, "verified", T0, T0 + S, None, "x", T0)
    assert store.trust.set_target_verification(t.id, tg.id, "verified", T0, T0 + 10 * S, None, "pr_1", T0)
    got = store.trust.target_trust(tg.id)
    assert (got.state, got.verified_us, got.expires_us, got.error, got.tenant_id) == (
        "verified", T0, T0 + 10 * S, None, t.id)
    assert store.trust.set_target_verification(t.id, tg.id, "failed", None, None, "HTTP 404", "pr_1", T0 + S)
    assert store.trust.target_trust(tg.id).error == "HTTP 404"
    [a, b] = [r.as_json() for r in store.trust.audit_rows(tenant_id=t.id)]
    assert a["prior"]["state"] == "unverified" and a["new"]["state"] == "verified"
    assert b["prior"]["state"] == "verified" and b["new"] == {"target_id": tg.id, "state": "failed",
                                                              "expires_us": None, "error": "HTTP 404"}
    assert store.registry.count_targets(t.id) == 1


def test_tenant_key_is_installed_once(store):
    t = add_tenant(store)
    assert store.trust.tenant_wrapped_key(t.id) == (True, None)
    assert store.trust.install_tenant_key(t.id, b"first") == b"first"
    assert store.trust.install_tenant_key(t.id, b"second") == b"first"       # compare-and-set: the first stays
    assert store.trust.tenant_wrapped_key(t.id) == (True, b"first")
    assert store.trust.tenant_wrapped_key("tn_nope") == (False, None)


def _fire(trig, at_us, state=FireState.PENDING):
    return NewFire(trig.tenant_id, trig.id, at_us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, state, at_us, "2026f", "n")


def test_delete_tenant_destroys_the_key_stops_everything_and_purge_keeps_only_counts(store):
    t = add_tenant(store)
    keep = add_tenant(store)
    tg = add_target(store, t)
    trig, _, first = add_trigger(store, t, tg, {"every": "60s"})
    ktrig, _, kfirst = add_trigger(store, keep, add_target(store, keep), {"every": "60s"})
    store.timing.apply_decisions([
        Decision(Advance(trig.id, first, 1, first + 60 * S, 1), (_fire(trig, first, FireState.DELIVERED),)),
        Decision(Advance(ktrig.id, kfirst, 1, kfirst + 60 * S, 1), (_fire(ktrig, kfirst),)),
    ])
    store.timing.apply_decisions([Decision(Advance(trig.id, first + 60 * S, 1, first + 120 * S, 1),
                                    (_fire(trig, first + 60 * S),))])
    store.trust.install_tenant_key(t.id, b"wrapped")
    store.trust.create_principal_audited(Principal(new_id("pr"), t.id, "p", frozenset({"reader"}), T0), "h-p", "x")

    out = store.trust.delete_tenant(t.id, "operator", T0 + S)
    assert out == {"principals_revoked": 2, "triggers_stopped": 1, "fires_skipped": 1}
    assert store.trust.delete_tenant(t.id, "operator", T0 + S) is None
    assert store.trust.tenant_wrapped_key(t.id) == (False, None)              # the key is gone at once
    assert store.trust.principal_by_token_hash("h-p") is None
    assert [r.trigger_id for r in store.timing.due_rows(2**62, 100)] == [ktrig.id]
    [pending] = [f for f in store.history.list_fires(t.id, trig.id) if f.scheduled_us == first + 60 * S]
    assert (pending.state, pending.cause) == ("skipped", "skipped: the tenant was deleted")
    assert store.trust.install_tenant_key(t.id, b"again") is None

    assert store.trust.purge_deleted_tenants(T0, T0 + 2 * S) == []             # not past the grace yet
    [summary] = store.trust.purge_deleted_tenants(T0 + S, T0 + 2 * S)
    assert summary["tenant_id"] == t.id and summary["fires"] == 2 and summary["triggers"] == 1
    assert store.history.list_fires(t.id, trig.id) == [] and store.registry.get_version(trig.id, 1) is None
    assert store.registry.get_target(t.id, tg.id) is None and store.trust.target_trust(tg.id) is None
    assert store.trust.list_principals(t.id) == []
    day = first // 86_400_000_000
    assert sorted(store.trust.fire_counts(t.id)) == sorted([(day, "delivered", 1), (day, "skipped", 1)])
    state = store.registry.tenant_state(t.id)
    assert state["purged_us"] == T0 + 2 * S and store.registry.tenant_id_by_name(t.name) is None   # name scrubbed
    assert store.trust.purge_deleted_tenants(T0 + S, T0 + 3 * S) == []         # idempotent
    # The other tenant is untouched.
    assert len(store.history.list_fires(keep.id, ktrig.id)) == 1 and store.registry.get_trigger(keep.id,
                                                                                                ktrig.id) is not None
    actions = [r.action for r in store.trust.audit_rows(tenant_id=t.id)]
    assert actions[-2:] == ["tenant.delete", "tenant.purge"]
    assert verify_chain(store).ok


def test_live_trigger_count(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    for _ in range(3):
        add_trigger(store, t, tg, {"every": "60s"})
    assert store.registry.count_live_triggers(t.id) == 3
    assert store.registry.count_live_triggers(add_tenant(store).id) == 0
