"""Purpose keys derived from the deployment's key-encryption key (KEK).

Some checks need a secret that the database does not hold: the target-ownership challenge's
expected response (a value an echoing origin cannot produce) and the audit chain's HMAC (a database
writer cannot recompute it). Rather than a second key file to lose, each purpose gets its own key,
derived from the KEK with HKDF-SHA256 (``info`` = ``fireledger/<label>/v1``): one secret to keep,
keys that cannot be turned into each other or back into the KEK.

Contract:

* The same KEK and label always give the same 32 bytes, in every process of a deployment.
* Different labels give independent keys; a derived key reveals nothing about the KEK.
* Replacing the KEK replaces every derived key: audit rows and verification responses made under the
  old one no longer check (docs/operations.md says what a KEK change implies).
"""

from __future__ import annotations

import threading
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fireledger.domain.trust_records import AUDIT_KEY_LABEL
from fireledger.store.trust import SqlTrust, install_audit_key_source

_LOCK = threading.Lock()
_CACHE: dict[tuple[bytes, str], bytes] = {}


def derive_from(kek: bytes, label: str) -> bytes:
    """The 32-byte key for ``label`` under ``kek`` (pure; cached per process)."""
    if not label or "/" in label:
        raise ValueError(f"label: {label!r} must be a non-empty word without '/'")
    with _LOCK:
        hit = _CACHE.get((kek, label))
    if hit is not None:
        return hit
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
               info=f"fireledger/{label}/v1".encode()).derive(kek)
    with _LOCK:
        _CACHE[(kek, label)] = key
    return key


def derived_key(store: Any, label: str) -> bytes:
    """The key for ``label`` under the deployment's KEK (as :func:`fireledger.security.envelope.load_kek`
    finds it for ``store``). Raises :class:`~fireledger.security.envelope.KekError` without a KEK."""
    from fireledger.security.envelope import cipher_for

    return derive_from(cipher_for(store).kek, label)


def _audit_key_source(trust: SqlTrust, upgrading: bool) -> bytes:
    """The audit chain's key for ``trust`` (its engine locates the KEK). During the upgrade that keys
    the chain (migration 0011) the KEK must exist already: it is loaded, never created."""
    if not upgrading:
        return derived_key(trust, AUDIT_KEY_LABEL)
    from fireledger.security.envelope import KekError, load_kek

    try:
        kek = load_kek(trust)
    except KekError as exc:
        seq, _ = trust.audit_head()
        raise KekError(f"migration 0011 seals the {seq} existing audit rows under the audit key, "
                       f"derived from the key-encryption key: {exc}") from None
    return derive_from(kek, AUDIT_KEY_LABEL)


install_audit_key_source(_audit_key_source)   # the store keys its audit chain with this (decision 0111)

__all__ = ["derive_from", "derived_key"]
