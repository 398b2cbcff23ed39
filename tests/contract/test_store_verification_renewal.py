"""The trust area's verification renewal methods (issue 17 item 3, decisions 0170-0172), on both
engines: the re-verification claim is exclusive and spaced, a failed renewal leaves the target
verified with its error, a verification past its expiry lapses exactly once (a renewal committed
first wins), every change is audited, and the expiring count per tenant is what the gauge shows."""

from __future__ import annotations

from fireledger.store import Store
from storekit import T0, add_target, add_tenant

S = 1_000_000
DAY = 86_400 * S


def _verified(store: Store, tenant_id: str, target_id: str, expires_us: int, method: str = "http") -> None:
    assert store.trust.set_target_verification(tenant_id, target_id, "verified", T0, expires_us, None, "pr_1", T0,
                                               method=method)


def test_a_proof_records_its_method_and_the_method_is_kept_by_a_failure(store: Store) -> None:
    t = add_tenant(store)
    tg = add_target(store, t, verification="unverified")
    assert store.trust.target_trust(tg.id).method is None
    _verified(store, t.id, tg.id, T0 + 30 * DAY, method="dns")
    got = store.trust.target_trust(tg.id)
    assert (got.state, got.method, got.expires_us) == ("verified", "dns", T0 + 30 * DAY)
    assert store.trust.audit_rows(tenant_id=t.id)[-1].as_json()["new"]["method"] == "dns"
    assert store.trust.set_target_verification(t.id, tg.id, "failed", None, None, "nope", "pr_1", T0 + S)
    assert store.trust.target_trust(tg.id).method == "dns"


def test_the_claim_takes_targets_in_their_window_once_until_the_retry_instant(store: Store) -> None:
    t = add_tenant(store)
    soon, later, far = (add_target(store, t, verification="unverified") for _ in range(3))
    _verified(store, t.id, soon.id, T0 + 2 * DAY)
    _verified(store, t.id, later.id, T0 + 6 * DAY)
    _verified(store, t.id, far.id, T0 + 20 * DAY)
    now, horizon, until = T0 + S, T0 + S + 7 * DAY, T0 + S + 6 * 3600 * S
    got = store.trust.claim_reverifications(now, horizon, until, limit=10)
    assert [g.id for g in got] == [soon.id, later.id]               # soonest expiry first; `far` outside
    assert store.trust.claim_reverifications(now, horizon, until) == []     # held: a second caller gets none
    assert store.trust.claim_reverifications(until - 1, horizon, until + DAY) == []
    again = store.trust.claim_reverifications(until, horizon, until + DAY, limit=1)
    assert [g.id for g in again] == [soon.id]                        # free again at the retry instant; limit kept


def test_a_renewal_clears_the_claim_and_moves_the_target_out_of_the_window(store: Store) -> None:
    t = add_tenant(store)
    tg = add_target(store, t, verification="unverified")
    _verified(store, t.id, tg.id, T0 + 2 * DAY)
    now = T0 + S
    [taken] = store.trust.claim_reverifications(now, now + 7 * DAY, now + DAY)
    assert store.trust.set_target_verification(t.id, tg.id, "verified", now, now + 30 * DAY, None, "sys", now)
    assert store.trust.claim_reverifications(now, now + 7 * DAY, now + DAY) == []
    # Near the new expiry it is claimable at once: the old claim instant was cleared.
    late = now + 25 * DAY
    assert [g.id for g in store.trust.claim_reverifications(late, late + 7 * DAY, late + DAY)] == [tg.id]


def test_a_failed_renewal_leaves_the_target_verified_with_its_error_audited(store: Store) -> None:
    t, other = add_tenant(store), add_tenant(store, "other")
    tg = add_target(store, t, verification="unverified")
    _verified(store, t.id, tg.id, T0 + 2 * DAY)
    assert not store.trust.note_reverification_failure(other.id, tg.id, "HTTP 404", "sys", T0 + S)
    assert store.trust.note_reverification_failure(t.id, tg.id, "HTTP 404", "sys", T0 + S)
    got = store.trust.target_trust(tg.id)
    assert (got.state, got.expires_us, got.error) == ("verified", T0 + 2 * DAY, "HTTP 404")
    row = store.trust.audit_rows(tenant_id=t.id)[-1]
    assert (row.action, row.actor) == ("target.reverify", "sys")
    assert row.as_json()["new"] == {"target_id": tg.id, "state": "verified", "expires_us": T0 + 2 * DAY,
                                    "error": "HTTP 404"}
    unverified = add_target(store, t, verification="unverified")
    assert not store.trust.note_reverification_failure(t.id, unverified.id, "x", "sys", T0 + S)


def test_a_verification_past_its_expiry_lapses_once_audited(store: Store) -> None:
    t = add_tenant(store)
    old, fresh = (add_target(store, t, verification="unverified") for _ in range(2))
    _verified(store, t.id, old.id, T0 + DAY)
    _verified(store, t.id, fresh.id, T0 + 3 * DAY)
    store.trust.note_reverification_failure(t.id, old.id, "HTTP 404", "sys", T0 + S)
    assert store.trust.lapse_verifications(T0 + DAY - 1, "sys") == []
    [lapsed] = store.trust.lapse_verifications(T0 + DAY, "sys")
    assert lapsed.id == old.id and lapsed.state == "verified"          # as it was before
    got = store.trust.target_trust(old.id)
    assert got.state == "lapsed" and got.expires_us == T0 + DAY
    assert got.error.startswith("the verification lapsed at ") and "last try: HTTP 404" in got.error
    assert store.trust.lapse_verifications(T0 + 2 * DAY, "sys") == []   # once
    assert store.trust.target_trust(fresh.id).state == "verified"
    actions = [r.action for r in store.trust.audit_rows(tenant_id=t.id)]
    assert actions.count("target.lapse") == 1
    assert store.trust.claim_reverifications(T0 + DAY, T0 + 9 * DAY, T0 + 10 * DAY) != []   # only `fresh`
    assert store.trust.target_trust(old.id).state == "lapsed"


def test_the_expiring_count_per_tenant(store: Store) -> None:
    a, b = add_tenant(store, "a"), add_tenant(store, "b")
    for tenant, expiries in ((a, (2 * DAY, 6 * DAY, 9 * DAY)), (b, (3 * DAY,))):
        for e in expiries:
            tg = add_target(store, tenant, verification="unverified")
            _verified(store, tenant.id, tg.id, T0 + e)
    gone = add_target(store, b, verification="unverified")
    _verified(store, b.id, gone.id, T0 + DAY)
    assert store.registry.delete_target_audited(b.id, gone.id, "pr_1", T0) == "deleted"
    assert store.trust.verification_expiring(T0, T0 + 7 * DAY) == {a.id: 2, b.id: 1}
    assert store.trust.verification_expiring(T0 + 7 * DAY, T0 + 14 * DAY) == {a.id: 1}
    add_target(store, a)   # verified without expiry (an operator's): never counted
    assert store.trust.verification_expiring(T0, T0 + 7 * DAY) == {a.id: 2, b.id: 1}
