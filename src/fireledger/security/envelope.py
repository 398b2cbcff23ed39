"""Payload envelope encryption with a per-tenant data key (DESIGN.md invariant 14, seed ADR-16).

* **Keys.** Each tenant has one AES-256-GCM *data key*, created on first use and stored only
  *wrapped* (AES-GCM under the key-encryption key, associated data = the tenant id) in
  ``tenants.wrapped_key``. The *key-encryption key* (KEK, 32 bytes) comes from, in order:
  ``FIRELEDGER_KEK`` (base64, base64url or hex), the file named by ``FIRELEDGER_KEK_FILE``, or a
  default file — beside the SQLite database (``<db stem>-kek.key``), else ``./fireledger-kek.key`` —
  created on first use with mode 0600. Every control and dispatch process of one deployment must
  see the same KEK (like the dispatch signing key ring).
* **Ciphertext.** ``b"FLE\\x01" | sealed version (8 bytes, big-endian) | nonce (12) | AES-GCM
  ciphertext+tag``. The associated data binds it to (tenant, trigger, version in which the payload was
  written): moved to another tenant or trigger, or to an older version, it does not open. An
  amendment that keeps the payload keeps its ciphertext (sealed at an earlier version ≤ the current).
* **Where.** The control plane seals where versions are written; only the attempt runner opens
  (:func:`open_job_payload`). Nothing here logs; errors name tenant, trigger and version, never
  content.
* **Crypto-shredding.** Deleting a tenant removes its wrapped key in the same transaction
  (:meth:`fireledger.store.trust.TrustMixin.delete_tenant`): its payloads can no longer be opened by
  anyone. Unwrapped keys are cached per process for at most :data:`KEY_CACHE_S` seconds, so a
  deletion reaches every process within that time (at once in the deleting one: :meth:`forget`).
* Payloads stored before encryption existed (no magic prefix) are returned as they are.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fireledger.store.engine import StoreError

log = logging.getLogger("fireledger.security")

MAGIC = b"FLE\x01"
_WRAP_MAGIC = b"FLK\x01"
KEY_CACHE_S = 2.0
KEK_ENV = "FIRELEDGER_KEK"
KEK_FILE_ENV = "FIRELEDGER_KEK_FILE"


class KekError(StoreError):
    """The key-encryption key is missing, malformed or not the one that wrapped a tenant's key (a
    :class:`~fireledger.store.StoreError`: commands print it as one line and exit 2)."""


class PayloadUnreadable(ValueError):
    """A payload cannot be opened (tenant deleted, wrong binding, tampered). Never carries content."""


def _decode_key(text: str, where: str) -> bytes:
    s = text.strip()
    padded = s + "=" * (-len(s) % 4)
    decoders: list[Callable[[], bytes]] = [lambda: bytes.fromhex(s),
                                           lambda: base64.b64decode(padded, validate=True),
                                           lambda: base64.urlsafe_b64decode(padded)]
    for decode in decoders:
        try:
            raw = decode()
        except (ValueError, binascii.Error):
            continue
        if len(raw) == 32:
            return raw
    raise KekError(f"{where}: the key-encryption key must be 32 bytes, written as base64 or hex")


def kek_file_path(store: Any) -> Path:
    """Where the KEK file is (see the module docstring); the env file wins."""
    explicit = os.environ.get(KEK_FILE_ENV)
    if explicit:
        return Path(explicit)
    path = getattr(getattr(store, "engine", None), "path", None)
    if path:
        return Path(path).with_name(Path(path).stem + "-kek.key")
    return Path("./fireledger-kek.key")


def load_kek(store: Any = None, *, create: bool = True) -> bytes:
    """The deployment's KEK (see the module docstring); creates the default/named file when missing
    (``create``), exclusively and with mode 0600, so concurrent first starts agree on one key."""
    env = os.environ.get(KEK_ENV)
    if env:
        return _decode_key(env, KEK_ENV)
    path = kek_file_path(store)
    try:
        return _decode_key(path.read_text(encoding="ascii"), str(path))
    except FileNotFoundError:
        if not create:
            raise KekError(f"{path}: no key-encryption key file (set {KEK_ENV} or {KEK_FILE_ENV})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KekError(f"{path}: cannot read the key-encryption key ({type(exc).__name__})") from None
    key = AESGCM.generate_key(bit_length=256)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _decode_key(path.read_text(encoding="ascii"), str(path))
    except OSError as exc:
        raise KekError(f"{path}: cannot create the key-encryption key file ({type(exc).__name__})") from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(base64.b64encode(key).decode("ascii") + "\n")
    log.warning("created a new key-encryption key at %s (mode 0600): every control and dispatch process "
                "must use this key (or set %s / %s); losing it makes every payload unreadable",
                path, KEK_ENV, KEK_FILE_ENV)
    return key


def _payload_ad(tenant_id: str, trigger_id: str, version: int) -> bytes:
    return f"fireledger/payload/v1\x00{tenant_id}\x00{trigger_id}\x00{version}".encode()


def _wrap_ad(tenant_id: str) -> bytes:
    return f"fireledger/data-key/v1\x00{tenant_id}".encode()


class PayloadCipher:
    """Seals and opens payloads of one store's tenants (thread-safe)."""

    def __init__(self, store: Any, kek: bytes | None = None, *, cache_s: float = KEY_CACHE_S) -> None:
        self.store = store
        self._kek = kek
        self._cache_s = cache_s
        self._keys: dict[str, tuple[bytes, float]] = {}
        self._lock = threading.Lock()

    @property
    def kek(self) -> bytes:
        if self._kek is None:
            self._kek = load_kek(self.store)
        return self._kek

    def ensure_kek(self) -> None:
        """Load (or create) the KEK now: a process refuses to start without one (:class:`KekError`)."""
        _ = self.kek

    def _kek_id(self) -> bytes:
        return hashlib.sha256(b"fireledger-kek-id\x00" + self.kek).digest()[:8]

    def wrap(self, tenant_id: str, data_key: bytes) -> bytes:
        nonce = os.urandom(12)
        return _WRAP_MAGIC + self._kek_id() + nonce + AESGCM(self.kek).encrypt(nonce, data_key, _wrap_ad(tenant_id))

    def unwrap(self, tenant_id: str, wrapped: bytes) -> bytes:
        if not wrapped.startswith(_WRAP_MAGIC) or len(wrapped) < 4 + 8 + 12 + 16:
            raise KekError(f"tenant {tenant_id}: the stored data key is not in a known format")
        if wrapped[4:12] != self._kek_id():
            raise KekError(f"tenant {tenant_id}: its data key was wrapped by another key-encryption key "
                           f"(check {KEK_ENV} / {KEK_FILE_ENV})")
        try:
            return AESGCM(self.kek).decrypt(wrapped[12:24], wrapped[24:], _wrap_ad(tenant_id))
        except InvalidTag:
            raise KekError(f"tenant {tenant_id}: its wrapped data key does not authenticate") from None

    def forget(self, tenant_id: str | None = None) -> None:
        """Drop cached data keys (one tenant's, or all)."""
        with self._lock:
            if tenant_id is None:
                self._keys.clear()
            else:
                self._keys.pop(tenant_id, None)

    def has_key(self, tenant_id: str) -> bool:
        """Whether the tenant's data key is cached (and fresh) in this process."""
        with self._lock:
            hit = self._keys.get(tenant_id)
        return hit is not None and hit[1] > time.monotonic()

    def data_key(self, tenant_id: str, *, create: bool) -> bytes:
        """The tenant's data key (created and installed on first use when ``create``)."""
        now = time.monotonic()
        with self._lock:
            hit = self._keys.get(tenant_id)
        if hit is not None and hit[1] > now:
            return hit[0]
        live, wrapped = self.store.tenant_wrapped_key(tenant_id)
        if not live:
            self.forget(tenant_id)
            raise PayloadUnreadable(f"tenant {tenant_id} is deleted or unknown: its data key is destroyed")
        if wrapped is None:
            if not create:
                raise PayloadUnreadable(f"tenant {tenant_id} has no data key")
            wrapped = self.store.install_tenant_key(tenant_id, self.wrap(tenant_id, AESGCM.generate_key(256)))
            if wrapped is None:
                raise PayloadUnreadable(f"tenant {tenant_id} is deleted or unknown: its data key is destroyed")
        key = self.unwrap(tenant_id, wrapped)
        with self._lock:
            self._keys[tenant_id] = (key, now + self._cache_s)
        return key

    def seal(self, tenant_id: str, trigger_id: str, version: int, plaintext: bytes) -> bytes:
        """Encrypt a payload written at ``version`` of ``trigger_id``."""
        key = self.data_key(tenant_id, create=True)
        nonce = os.urandom(12)
        ct = AESGCM(key).encrypt(nonce, plaintext, _payload_ad(tenant_id, trigger_id, version))
        return MAGIC + version.to_bytes(8, "big") + nonce + ct

    def open(self, tenant_id: str, trigger_id: str, version: int, blob: bytes) -> bytes:
        """Decrypt a payload of ``version`` of ``trigger_id`` (legacy plaintext is returned as is)."""
        if not blob.startswith(MAGIC):
            return blob
        where = f"the payload of trigger {trigger_id} version {version}"
        if len(blob) < 4 + 8 + 12 + 16:
            raise PayloadUnreadable(f"{where} is truncated")
        sealed = int.from_bytes(blob[4:12], "big")
        if not 1 <= sealed <= version:
            raise PayloadUnreadable(f"{where} was sealed for another version")
        key = self.data_key(tenant_id, create=False)
        try:
            return AESGCM(key).decrypt(blob[12:24], blob[24:], _payload_ad(tenant_id, trigger_id, sealed))
        except InvalidTag:
            raise PayloadUnreadable(f"{where} does not authenticate (tampered, or not this tenant's)") from None


_CIPHERS: weakref.WeakKeyDictionary[Any, PayloadCipher] = weakref.WeakKeyDictionary()
_CIPHERS_LOCK = threading.Lock()


def cipher_for(store: Any) -> PayloadCipher:
    """The process's cipher for ``store`` (the KEK is loaded on first use)."""
    with _CIPHERS_LOCK:
        c = _CIPHERS.get(store)
        if c is None:
            c = _CIPHERS[store] = PayloadCipher(store)
        return c


def seal_payload(store: Any, tenant_id: str, trigger_id: str, version: int, plaintext: bytes) -> bytes:
    """Seal a payload where a trigger version is written (the control plane)."""
    return cipher_for(store).seal(tenant_id, trigger_id, version, plaintext)


async def open_job_payload(store: Any, job: Any) -> Any:
    """The attempt runner's one decryption point: ``job`` with its payload opened. Raises
    :class:`PayloadUnreadable` (a ``ValueError``: the attempt is recorded ``failed`` with it as the
    cause) when the tenant's key is destroyed or the ciphertext does not authenticate. The store is
    read (off the event loop) only when the tenant's data key is not cached."""
    import asyncio

    payload: bytes = job.payload
    if not payload.startswith(MAGIC):
        return job
    f = job.fire
    cipher = cipher_for(store)
    if cipher.has_key(f.tenant_id):
        plain = cipher.open(f.tenant_id, f.trigger_id, f.version, payload)
    else:
        plain = await asyncio.to_thread(cipher.open, f.tenant_id, f.trigger_id, f.version, payload)
    return replace(job, payload=plain)


__all__ = ["KEY_CACHE_S", "MAGIC", "KekError", "PayloadCipher", "PayloadUnreadable", "cipher_for", "kek_file_path",
           "load_kek", "open_job_payload", "seal_payload"]
