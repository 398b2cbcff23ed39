"""Hardening, class "crypto-shredding limits" (issue 13, finding 10).

* Deleting a tenant destroys its wrapped data key; on SQLite the old key bytes must then be in
  neither the database file (``secure_delete`` zeroes freed content) nor the WAL (checkpointed with
  TRUNCATE after the deletion and after a purge).
* There is no plaintext path: a payload without the envelope prefix is refused as unreadable, with
  a cause, by the cipher, the attempt runner's admission and the queue view — never passed on.

What shredding cannot reach (PostgreSQL dead tuples until VACUUM, WAL archives, backups, replicas,
copies of the SQLite file) is documented in docs/operations.md and docs/decisions/0081.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from fireledger.domain.model import DispatchJob, Fire, Policies
from fireledger.security.envelope import PayloadUnreadable, cipher_for
from fireledger.security.targets import admit
from fireledger.security.tenancy import delete_tenant, purge
from fireledger.store import Store
from storekit import T0, add_target, add_tenant, add_trigger

SENTINEL = b'{"shred-me":"SENTINEL-5b1e"}'


def _files(db: Path) -> bytes:
    out = b""
    for p in (db, db.with_name(db.name + "-wal")):
        if p.exists():
            out += p.read_bytes()
    return out


def _sealed_tenant(db: Path) -> tuple[Store, str, bytes, bytes]:
    store = Store.open(f"sqlite:///{db}")
    a = add_tenant(store)
    tg = add_target(store, a)
    trig, _, _ = add_trigger(store, a, tg, {"every": "60s"}, payload=json.loads(SENTINEL))
    cipher_for(store).data_key(a.id, create=True)             # installed by the sealing above, or now
    wrapped = store.trust.tenant_wrapped_key(a.id)[1]
    assert wrapped is not None
    with store.engine.read() as c:
        blob = bytes(c.execute("SELECT payload FROM trigger_versions WHERE trigger_id = ?", (trig.id,)).fetchone()[0])
    store.engine.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    assert wrapped in _files(db) and blob in _files(db)      # written where shredding must reach
    return store, a.id, wrapped, blob


def test_sqlite_connections_overwrite_deleted_content(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path}/fl.db")
    try:
        assert store.engine.connection().execute("PRAGMA secure_delete").fetchone()[0] == 1
    finally:
        store.close()


def test_a_deleted_tenants_wrapped_key_is_in_neither_the_database_file_nor_the_wal(tmp_path):
    db = tmp_path / "fl.db"
    store, tenant_id, wrapped, _ = _sealed_tenant(db)
    try:
        assert delete_tenant(store, tenant_id, "operator", T0 + 1) is not None
        assert store.trust.tenant_wrapped_key(tenant_id) == (False, None)
        assert wrapped not in _files(db), "the destroyed data key is still readable in the SQLite files"
    finally:
        store.close()
    assert wrapped not in _files(db)


def test_a_purged_tenants_ciphertext_is_in_neither_file(tmp_path):
    db = tmp_path / "fl.db"
    store, tenant_id, _, blob = _sealed_tenant(db)
    try:
        assert delete_tenant(store, tenant_id, "operator", T0 + 1) is not None
        done = purge(store, T0 + 10 * 3_600_000_000, grace_s=0)
        assert [s["tenant_id"] for s in done] == [tenant_id]
        assert blob not in _files(db), "a purged payload's ciphertext is still in the SQLite files"
    finally:
        store.close()


def test_a_payload_without_the_envelope_is_refused_not_passed_on(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path}/fl.db")
    try:
        a = add_tenant(store)
        tg = add_target(store, a)
        stored = store.registry.get_target(a.id, tg.id)
        c = cipher_for(store)
        with pytest.raises(PayloadUnreadable, match="not sealed") as err:
            c.open(a.id, "tr_1", 1, SENTINEL)
        assert b"SENTINEL" not in str(err.value).encode()
        fire = Fire(a.id, "tr_1", T0, 0, 1, "scheduled", "on-time", "dispatching", None, T0, "n", T0, None,
                    "2026f", 1, None)
        job = DispatchJob(fire, 1, stored, SENTINEL, Policies(), "d", T0)
        out, cause = asyncio.run(admit(store, job, T0))
        assert cause is not None and "not sealed" in cause and "SENTINEL" not in cause
        assert out.payload == SENTINEL and out is job                        # refused: nothing opened, nothing sent
        sealed = replace(job, payload=c.seal(a.id, "tr_1", 1, SENTINEL))
        ok, none = asyncio.run(admit(store, sealed, T0))
        assert none is None and ok.payload == SENTINEL                       # the sealed one opens
    finally:
        store.close()
