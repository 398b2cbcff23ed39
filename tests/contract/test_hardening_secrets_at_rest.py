"""Hardening, class "secrets at rest outside the envelope" (issue 13, finding 9).

A target's Standard Webhooks signing secret is sealed under its tenant's data key, like payloads:
the ``targets`` row never holds it in plaintext (neither a new row nor, after start-up, an old one),
it opens only for its own target and tenant, and deleting the tenant shreds it. Real stores on both
engines; the upgrade path on a real ``fireledger serve`` process.
"""

from __future__ import annotations

import pytest

from e2e import Service
from fireledger.domain.keys import new_id
from fireledger.domain.model import Target
from fireledger.security import envelope
from fireledger.security.envelope import PayloadUnreadable, cipher_for
from fireledger.security.tenancy import delete_tenant
from fireledger.store.sqlitelib import sqlite3
from storekit import T0, add_tenant

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _raw_secret(store, target_id: str) -> str:
    ph = "?" if store.engine_name == "sqlite" else "%s"
    with store.engine.read() as c:
        return str(c.execute(f"SELECT secret FROM targets WHERE id = {ph}", (target_id,)).fetchone()[0])


def _target(tenant_id: str, secret: str = SECRET) -> Target:
    return Target(new_id("tg"), tenant_id, "http", "https://hooks.example.com/x", secret, "verified", new_id("v"), T0)


def test_a_new_target_secret_is_stored_sealed_and_opens_only_for_its_target(store):
    a, b = add_tenant(store), add_tenant(store, "other")
    t1, t2 = _target(a.id), _target(a.id, "whsec_" + "QUJD" * 8)
    store.registry.create_target(envelope.sealed_target(store, t1))
    store.registry.create_target_audited(envelope.sealed_target(store, t2), "pr_x")          # the API's path
    for t in (t1, t2):
        raw = _raw_secret(store, t.id)
        assert raw.startswith("flsec1.") and t.secret not in raw and t.secret[6:] not in raw
        stored = store.registry.get_target(a.id, t.id)
        assert stored is not None and envelope.open_secret(store, stored) == t.secret
    # Bound to (tenant, target): a sealed secret copied onto another target, or read as another
    # tenant's, does not open.
    moved = store.registry.get_target(a.id, t1.id)
    assert moved is not None
    with pytest.raises(PayloadUnreadable, match="does not authenticate"):
        cipher_for(store).open_secret(a.id, t2.id, moved.secret)
    with pytest.raises(PayloadUnreadable):
        cipher_for(store).open_secret(b.id, t1.id, moved.secret)


def test_a_write_never_stores_an_unsealed_secret(store):
    a = add_tenant(store)
    bad = _target(a.id, "plain-text-secret")
    with pytest.raises(ValueError, match="secret"):
        store.registry.create_target(bad)   # the store seals nothing: unsealed is refused
    assert store.registry.get_target(a.id, bad.id) is None


def test_an_unsealed_secret_is_refused_by_its_readers(store):
    a = add_tenant(store)
    t = _target(a.id)
    store.registry.create_target(envelope.sealed_target(store, t))
    with store.engine.write() as c:   # a row as an earlier release wrote it
        ph = "?" if store.engine_name == "sqlite" else "%s"
        c.execute(f"UPDATE targets SET secret = {ph} WHERE id = {ph}", (SECRET, t.id))
    legacy = store.registry.get_target(a.id, t.id)
    assert legacy is not None
    with pytest.raises(PayloadUnreadable, match="not sealed") as err:
        envelope.open_secret(store, legacy)
    assert SECRET not in str(err.value)
    # The upgrade path seals it (what every control and dispatch process runs at start-up).
    assert envelope.seal_stored_secrets(store) == 1 and envelope.seal_stored_secrets(store) == 0
    assert _raw_secret(store, t.id).startswith("flsec1.")
    sealed = store.registry.get_target(a.id, t.id)
    assert sealed is not None and envelope.open_secret(store, sealed) == SECRET


def test_deleting_the_tenant_shreds_its_target_secrets(store):
    a = add_tenant(store)
    t = _target(a.id)
    store.registry.create_target(envelope.sealed_target(store, t))
    stored = store.registry.get_target(a.id, t.id)
    assert stored is not None and envelope.open_secret(store, stored) == SECRET
    assert delete_tenant(store, a.id, "operator", T0 + 1) is not None
    for cipher in (cipher_for(store), envelope.PayloadCipher(store, envelope.load_kek())):   # this process, a fresh one
        with pytest.raises(PayloadUnreadable, match="destroyed"):
            cipher.open_secret(a.id, t.id, stored.secret)


def test_serve_seals_plaintext_secrets_left_by_an_earlier_release(tmp_path):
    db = tmp_path / "fl.db"
    from fireledger.store import Store

    store = Store.open(f"sqlite:///{db}")
    try:
        a = add_tenant(store)
        live, gone = _target(a.id), _target(a.id, "whsec_" + "WFla" * 8)
        store.registry.create_target(envelope.sealed_target(store, live))
        store.registry.create_target(envelope.sealed_target(store, gone))
        b = add_tenant(store, "deleted")
        orphan = _target(b.id, "whsec_" + "T1JQ" * 8)
        store.registry.create_target(envelope.sealed_target(store, orphan))
        with store.engine.write() as c:   # as an earlier release stored them
            for t in (live, gone, orphan):
                c.execute("UPDATE targets SET secret = ? WHERE id = ?", (t.secret, t.id))
        with store.engine.write() as c:   # a tenant deleted under the earlier release: its key is gone
            c.execute("UPDATE tenants SET wrapped_key = NULL, deleted_us = ? WHERE id = ?", (T0, b.id))
    finally:
        store.close()
    svc = Service(f"sqlite:///{db}", tmp_path).start()
    svc.stop()
    conn = sqlite3.connect(db)
    try:
        rows = dict(conn.execute("SELECT id, secret FROM targets").fetchall())
    finally:
        conn.close()
    assert rows[live.id].startswith("flsec1.") and rows[gone.id].startswith("flsec1.")
    assert rows[orphan.id] == ""                      # the deleted tenant's: shredded, not sealed
    raw = db.read_bytes() + (db.with_name(db.name + "-wal").read_bytes() if db.with_name(db.name + "-wal").exists()
                             else b"")
    for t in (live, gone, orphan):
        assert t.secret.encode() not in raw, "a signing secret is still in the database file in plaintext"
    store = Store.open(f"sqlite:///{db}")
    try:
        got = store.registry.get_target(a.id, live.id)
        assert got is not None and envelope.open_secret(store, got) == live.secret
    finally:
        store.close()
