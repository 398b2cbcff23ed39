"""Payload envelope encryption: per-tenant data keys wrapped by the KEK, ciphertext bound to
(tenant, trigger, version), crypto-shredding on tenant deletion, and where the KEK comes from —
on real SQLite and real PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from dataclasses import replace

import pytest

from fireledger.domain.model import DispatchJob, Fire, Policies
from fireledger.security.envelope import (
    MAGIC,
    KekError,
    PayloadCipher,
    PayloadUnreadable,
    cipher_for,
    create_kek,
    kek_file_path,
    load_kek,
    open_job_payload,
)
from fireledger.security.tenancy import delete_tenant
from storekit import T0, add_target, add_tenant

SENTINEL = b'{"card":"SENTINEL-4111-1111"}'
KEK = bytes(range(32))


def test_seal_and_open_bind_tenant_trigger_and_version(store):
    a, b = add_tenant(store), add_tenant(store)
    c = PayloadCipher(store, KEK)
    blob = c.seal(a.id, "tr_1", 2, SENTINEL)
    assert blob.startswith(MAGIC) and SENTINEL not in blob
    assert c.open(a.id, "tr_1", 2, blob) == SENTINEL
    assert c.open(a.id, "tr_1", 5, blob) == SENTINEL        # kept by later versions of the same trigger
    for tenant, trigger, version in ((b.id, "tr_1", 2), (a.id, "tr_2", 2), (a.id, "tr_1", 1)):
        with pytest.raises(PayloadUnreadable) as err:
            c.open(tenant, trigger, version, blob)
        assert "SENTINEL" not in str(err.value)
    tampered = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(PayloadUnreadable, match="does not authenticate"):
        c.open(a.id, "tr_1", 2, tampered)
    with pytest.raises(PayloadUnreadable, match="not sealed"):              # no plaintext ("legacy") path
        c.open(a.id, "tr_1", 2, b'{"legacy":1}')


def test_one_data_key_per_tenant_wrapped_by_the_kek(store):
    a = add_tenant(store)
    c = PayloadCipher(store, KEK)
    c.seal(a.id, "tr_1", 1, b"{}")
    live, wrapped = store.trust.tenant_wrapped_key(a.id)
    assert live and wrapped is not None and len(wrapped) == 4 + 8 + 12 + 32 + 16
    # Another process with the same KEK opens it; one with another KEK is told so, clearly.
    blob = c.seal(a.id, "tr_1", 1, SENTINEL)
    assert PayloadCipher(store, KEK).open(a.id, "tr_1", 1, blob) == SENTINEL
    with pytest.raises(KekError, match="another key-encryption key"):
        PayloadCipher(store, bytes(32)).open(a.id, "tr_1", 1, blob)


def test_after_tenant_deletion_the_ciphertext_cannot_be_decrypted(store):
    a = add_tenant(store)
    c = cipher_for(store)
    c._kek = KEK
    blob = c.seal(a.id, "tr_1", 1, SENTINEL)
    wrapped = store.trust.tenant_wrapped_key(a.id)[1]
    assert c.open(a.id, "tr_1", 1, blob) == SENTINEL        # cached key in this process
    assert delete_tenant(store, a.id, "operator", T0) is not None
    for cipher in (c, PayloadCipher(store, KEK)):           # this process, and a fresh one
        with pytest.raises(PayloadUnreadable, match="destroyed"):
            cipher.open(a.id, "tr_1", 1, blob)
    # Not even with the KEK and a copy of the wrapped key taken before: the key row is gone, and a
    # restored copy would be the only way back — which is why deletion removes it in one transaction.
    assert store.trust.tenant_wrapped_key(a.id) == (False, None) and wrapped is not None


def test_attempt_runner_opens_the_job_payload(store):
    a = add_tenant(store)
    c = cipher_for(store)
    c._kek = KEK
    tg = add_target(store, a)
    tg = store.registry.get_target(a.id, tg.id)                      # as stored: its secret sealed
    assert tg is not None and tg.secret.startswith("flsec1.")
    fire = Fire(a.id, "tr_9", T0, 0, 3, "scheduled", "on-time", "dispatching", None, T0, "n", T0, None, "2026f",
                1, None)
    job = DispatchJob(fire, 1, tg, c.seal(a.id, "tr_9", 3, SENTINEL), Policies(), "d", T0)
    opened = asyncio.run(open_job_payload(store, job))
    assert opened.payload == SENTINEL and opened.target.secret.startswith("whsec_")   # both opened
    c.forget()
    assert asyncio.run(open_job_payload(store, job)).payload == SENTINEL   # key read off the loop
    plain = replace(job, payload=b"{}")
    with pytest.raises(PayloadUnreadable, match="not sealed"):              # refused, never sent as is
        asyncio.run(open_job_payload(store, plain))
    delete_tenant(store, a.id, "operator", T0)
    with pytest.raises(PayloadUnreadable):
        asyncio.run(open_job_payload(store, job))


def test_kek_sources(store, tmp_path, monkeypatch):
    monkeypatch.delenv("FIRELEDGER_KEK", raising=False)
    monkeypatch.delenv("FIRELEDGER_KEK_FILE", raising=False)
    monkeypatch.setenv("FIRELEDGER_STATE_DIR", str(tmp_path / "state"))
    path = kek_file_path(store)
    assert path == tmp_path / "state" / "kek.key"                         # the state directory, never beside the db
    with pytest.raises(KekError, match="fireledger init"):                # never created silently
        load_kek(store)
    (tmp_path / "state").mkdir(mode=0o700)
    assert create_kek(path) and not create_kek(path)                       # `fireledger init`: once
    key = load_kek(store)
    assert len(key) == 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_kek(store) == key
    monkeypatch.setenv("FIRELEDGER_KEK", base64.b64encode(KEK).decode())
    assert load_kek(store) == KEK
    monkeypatch.setenv("FIRELEDGER_KEK", KEK.hex())
    assert load_kek(store) == KEK
    monkeypatch.setenv("FIRELEDGER_KEK", "too-short")
    with pytest.raises(KekError, match=r"FIRELEDGER_KEK: .*32 bytes") as err:
        load_kek(store)
    assert "too-short" not in str(err.value)
    monkeypatch.delenv("FIRELEDGER_KEK")
    named = tmp_path / "named.key"
    monkeypatch.setenv("FIRELEDGER_KEK_FILE", str(named))
    with pytest.raises(KekError, match="no key-encryption key"):
        load_kek(store)
    assert not named.exists()


def test_opened_payloads_are_served_only_while_the_tenant_key_is_fresh(store):
    """Decision 0138: what was opened is kept by exact ciphertext beside the tenant's data key and
    served only while that key is cached and fresh — a deletion stops it within the key cache's bound."""
    a = add_tenant(store)
    cipher_for(store)._kek = KEK
    tg = store.registry.get_target(a.id, add_target(store, a).id)
    assert tg is not None
    c = PayloadCipher(store, KEK)   # "another process": the deletion below does not tell it
    blob = c.seal(a.id, "tr_1", 2, SENTINEL)
    assert c.opened_cached(a.id, "tr_1", 2, blob) is None              # nothing opened yet
    assert c.open(a.id, "tr_1", 2, blob) == SENTINEL
    secret = c.open_secret(a.id, tg.id, tg.secret)
    assert c.opened_cached(a.id, "tr_1", 2, blob, tg.id, tg.secret) == (SENTINEL, secret)
    tampered = blob[:-1] + bytes([blob[-1] ^ 1])
    assert c.opened_cached(a.id, "tr_1", 2, tampered) is None          # other bytes: opened afresh, refused
    with pytest.raises(PayloadUnreadable, match="does not authenticate"):
        c.open(a.id, "tr_1", 2, tampered)
    assert c.opened_cached(a.id, "tr_9", 2, blob) is None              # bound to the trigger as the AD is
    assert c.opened_cached(a.id, "tr_1", 2, blob, tg.id, "flsec1.other") is None
    delete_tenant(store, a.id, "operator", T0)
    assert c.opened_cached(a.id, "tr_1", 2, blob) == (SENTINEL, None)   # as the cached key: until it lapses
    key, _ = c._keys[a.id]
    c._keys[a.id] = (key, 0.0)                   # its cached key lapses (KEY_CACHE_S later)
    assert c.opened_cached(a.id, "tr_1", 2, blob) is None
    with pytest.raises(PayloadUnreadable, match="destroyed"):
        c.open(a.id, "tr_1", 2, blob)
    c.forget(a.id)
    assert not c._opened                          # forgotten with the key
