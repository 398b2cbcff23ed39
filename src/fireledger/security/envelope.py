"""Payload envelope encryption with a per-tenant data key (DESIGN.md invariant 14, seed ADR-16).

* **Keys.** Each tenant has one AES-256-GCM *data key*, created on first use and stored only
  *wrapped* (AES-GCM under the key-encryption key, associated data = the tenant id) in
  ``tenants.wrapped_key``. The *key-encryption key* (KEK, 32 bytes) comes from, in order:
  ``FIRELEDGER_KEK`` (base64, base64url or hex), the file named by ``FIRELEDGER_KEK_FILE``, or
  ``kek.key`` in the state directory (:mod:`fireledger.statedir`). A KEK file is created only by
  ``fireledger init`` (:func:`create_kek`, mode 0600), never on a missing file: a process without
  its KEK refuses to start, and one whose KEK file group or others may read refuses too (the error
  names the ``chmod 600``). Every control and dispatch process of one deployment must see the same
  KEK (like the dispatch signing key ring).
* **Ciphertext.** ``b"FLE\\x01" | sealed version (8 bytes, big-endian) | nonce (12) | AES-GCM
  ciphertext+tag``. The associated data binds it to (tenant, trigger, version in which the payload was
  written): moved to another tenant or trigger, or to an older version, it does not open. An
  amendment that keeps the payload keeps its ciphertext (sealed at an earlier version ≤ the current).
* **Where.** The control plane seals where versions are written; only the attempt runner opens
  (:func:`open_job_payload`). Nothing here logs; errors name tenant, trigger and version, never
  content.
* **Crypto-shredding.** Deleting a tenant removes its wrapped key in the same transaction
  (:meth:`fireledger.store.trust.SqlTrust.delete_tenant`): its payloads can no longer be opened by
  anyone. Unwrapped keys are cached per process for at most :data:`KEY_CACHE_S` seconds, so a
  deletion reaches every process within that time (at once in the deleting one: :meth:`forget`).
  What the attempt runner opened is kept beside the key, by exact ciphertext, and served only while
  that key is cached and fresh (:meth:`PayloadCipher.opened_cached`, decision 0138): the same bound.
* **No plaintext path.** A payload without the envelope prefix is refused as unreadable (with that
  cause), never passed on as "legacy" plaintext.
* **Target secrets.** A target's Standard Webhooks signing secret is sealed under the same tenant data
  key (associated data ``fireledger/target-secret/v1\0tenant\0target``) and stored as text
  ``flsec1.<base64url>`` (:func:`seal_secret` / :func:`open_secret`); deleting the tenant shreds it
  too. :func:`seal_stored_secrets` seals rows written before this existed (run at start-up).
"""

from __future__ import annotations

import asyncio
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

from fireledger.domain.evolve import evolve
from fireledger.domain.model import Target
from fireledger.domain.trust_records import SECRET_PREFIX, is_sealed_secret
from fireledger.errors import FireledgerError
from fireledger.store.engine import StoreError

from .flight import once

log = logging.getLogger("fireledger.security")

MAGIC = b"FLE\x01"
_WRAP_MAGIC = b"FLK\x01"
KEY_CACHE_S = 2.0
#: Opened payloads and secrets kept per tenant (decision 0138); the tenant's set is cleared when full.
OPENED_CACHE_MAX = 20_000
KEK_ENV = "FIRELEDGER_KEK"
KEK_FILE_ENV = "FIRELEDGER_KEK_FILE"


class KekError(StoreError):
    """The key-encryption key is missing, malformed or not the one that wrapped a tenant's key (a
    :class:`~fireledger.store.StoreError`: commands print it as one line and exit 2)."""


class PayloadUnreadable(FireledgerError, ValueError):
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


def kek_file_path(store: Any = None) -> Path:
    """Where the KEK file is: ``FIRELEDGER_KEK_FILE``, else ``kek.key`` in the state directory."""
    from fireledger.settings import process_env
    from fireledger.statedir import state_dir

    explicit = process_env().get(KEK_FILE_ENV)
    if explicit:
        return Path(explicit)
    return state_dir() / "kek.key"


def legacy_kek_paths(store: Any = None) -> list[Path]:
    """Where releases before the state directory created the KEK: beside the SQLite file
    (``<stem>-kek.key``) and ``./fireledger-kek.key``. Such a file is never used silently: it is
    named in the refusal so the operator moves it (a new KEK would orphan every tenant's key)."""
    out = []
    path = getattr(getattr(store, "engine", None), "path", None)
    if path:
        out.append(Path(path).with_name(Path(path).stem + "-kek.key"))
    out.append(Path("./fireledger-kek.key"))
    return [p for p in out if p.exists()]


def _missing_kek(path: Path, store: Any) -> KekError:
    old = legacy_kek_paths(store)
    if old:
        return KekError(f"{path}: no key-encryption key here, but one is at its old place {old[0]}: move it "
                        f"(mv {old[0]} {path}) or set {KEK_FILE_ENV}={old[0]}")
    return KekError(f"{path}: no key-encryption key; run `fireledger init` to create one "
                    f"(or set {KEK_ENV} or {KEK_FILE_ENV})")


def load_kek(store: Any = None) -> bytes:
    """The deployment's KEK (see the module docstring). Never creates one: a missing file, a file
    group or others may access, or a malformed key raises :class:`KekError` naming the file and the
    fix (``fireledger init``, ``chmod 600 <file>``)."""
    from fireledger.settings import process_env
    from fireledger.statedir import private_file_problem

    env = process_env().get(KEK_ENV)
    if env:
        return _decode_key(env, KEK_ENV)
    path = kek_file_path(store)
    if not path.exists():
        raise _missing_kek(path, store)
    problem = private_file_problem(path, "key-encryption key file")
    if problem is not None:
        raise KekError(problem)
    try:
        return _decode_key(path.read_text(encoding="ascii"), str(path))
    except FileNotFoundError:
        raise _missing_kek(path, store) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KekError(f"{path}: cannot read the key-encryption key ({type(exc).__name__})") from None


def create_kek(path: Path, store: Any = None) -> bool:
    """``fireledger init``: create the KEK file at ``path`` (exclusively, mode 0600) unless it
    exists; True when created. Refuses (:class:`KekError`) when a KEK exists at an old place (a new
    key would orphan the data keys it wrapped) or the directory cannot be written."""
    if path.exists():
        return False
    old = legacy_kek_paths(store)
    if old:
        raise _missing_kek(path, store)
    key = AESGCM.generate_key(bit_length=256)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    except OSError as exc:
        raise KekError(f"{path}: cannot create the key-encryption key file ({type(exc).__name__})") from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(base64.b64encode(key).decode("ascii") + "\n")
        f.flush()
        os.fsync(f.fileno())
    log.info("created a new key-encryption key at %s (mode 0600): every control and dispatch process "
                "must use this key (or set %s / %s); losing it makes every payload unreadable",
                path, KEK_ENV, KEK_FILE_ENV)
    return True


def _payload_ad(tenant_id: str, trigger_id: str, version: int) -> bytes:
    return f"fireledger/payload/v1\x00{tenant_id}\x00{trigger_id}\x00{version}".encode()


def _secret_ad(tenant_id: str, target_id: str) -> bytes:
    return f"fireledger/target-secret/v1\x00{tenant_id}\x00{target_id}".encode()


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
        # Opened payloads and secrets by tenant, then by (what, id, version, ciphertext): served only
        # while the tenant's data key is cached and fresh (:meth:`opened_cached`), dropped with it.
        self._opened: dict[str, dict[tuple[str, str, int, bytes | str], bytes | str]] = {}

    @property
    def kek(self) -> bytes:
        if self._kek is None:
            self._kek = load_kek(self.store)
        return self._kek

    def ensure_kek(self) -> None:
        """Load the KEK now: a process refuses to start without one (:class:`KekError`)."""
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
                self._opened.clear()
            else:
                self._keys.pop(tenant_id, None)
                self._opened.pop(tenant_id, None)

    def has_key(self, tenant_id: str) -> bool:
        """Whether the tenant's data key is cached (and fresh) in this process."""
        with self._lock:
            hit = self._keys.get(tenant_id)
        return hit is not None and hit[1] > time.monotonic()

    def opened_cached(self, tenant_id: str, trigger_id: str, version: int, blob: bytes, target_id: str | None = None,
                      stored_secret: str | None = None) -> tuple[bytes, str | None] | None:
        """The payload (and, with ``target_id``, the target's signing secret) as :meth:`open` /
        :meth:`open_secret` opened them earlier from exactly these ciphertexts, or None. Served only
        while the tenant's data key is cached and fresh, so a deleted tenant's payloads stop opening
        within :data:`KEY_CACHE_S` exactly as without this cache (decision 0138)."""
        now = time.monotonic()
        with self._lock:
            hit = self._keys.get(tenant_id)
            if hit is None or hit[1] <= now:
                return None
            seen = self._opened.get(tenant_id)
            if seen is None:
                return None
            plain = seen.get(("p", trigger_id, version, blob))
            secret = None if target_id is None else seen.get(("s", target_id, 0, stored_secret or ""))
        if not isinstance(plain, bytes) or (target_id is not None and not isinstance(secret, str)):
            return None
        return plain, secret if isinstance(secret, str) else None

    def _remember(self, tenant_id: str, key: tuple[str, str, int, bytes | str], value: bytes | str) -> None:
        with self._lock:
            seen = self._opened.setdefault(tenant_id, {})
            if len(seen) >= OPENED_CACHE_MAX:
                seen.clear()
            seen[key] = value

    def data_key(self, tenant_id: str, *, create: bool) -> bytes:
        """The tenant's data key (created and installed on first use when ``create``)."""
        now = time.monotonic()
        with self._lock:
            hit = self._keys.get(tenant_id)
        if hit is not None and hit[1] > now:
            return hit[0]
        live, wrapped = self.store.trust.tenant_wrapped_key(tenant_id)
        if not live:
            self.forget(tenant_id)
            raise PayloadUnreadable(f"tenant {tenant_id} is deleted or unknown: its data key is destroyed")
        if wrapped is None:
            if not create:
                raise PayloadUnreadable(f"tenant {tenant_id} has no data key")
            wrapped = self.store.trust.install_tenant_key(tenant_id, self.wrap(tenant_id, AESGCM.generate_key(256)))
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
        """Decrypt a payload of ``version`` of ``trigger_id``. A blob without the envelope prefix is
        refused (:class:`PayloadUnreadable`): there is no plaintext path."""
        where = f"the payload of trigger {trigger_id} version {version}"
        if not blob.startswith(MAGIC):
            raise PayloadUnreadable(f"{where} is not sealed (stored without encryption); it is not sent")
        if len(blob) < 4 + 8 + 12 + 16:
            raise PayloadUnreadable(f"{where} is truncated")
        sealed = int.from_bytes(blob[4:12], "big")
        if not 1 <= sealed <= version:
            raise PayloadUnreadable(f"{where} was sealed for another version")
        key = self.data_key(tenant_id, create=False)
        try:
            plain = AESGCM(key).decrypt(blob[12:24], blob[24:], _payload_ad(tenant_id, trigger_id, sealed))
        except InvalidTag:
            raise PayloadUnreadable(f"{where} does not authenticate (tampered, or not this tenant's)") from None
        self._remember(tenant_id, ("p", trigger_id, version, blob), plain)
        return plain

    def seal_secret(self, tenant_id: str, target_id: str, secret: str) -> str:
        """The stored form of a target's signing secret: ``flsec1.`` + base64url(nonce ‖ AES-GCM)."""
        key = self.data_key(tenant_id, create=True)
        nonce = os.urandom(12)
        ct = AESGCM(key).encrypt(nonce, secret.encode("utf-8"), _secret_ad(tenant_id, target_id))
        return SECRET_PREFIX + base64.urlsafe_b64encode(nonce + ct).decode("ascii").rstrip("=")

    def open_secret(self, tenant_id: str, target_id: str, stored: str) -> str:
        """The signing secret of target ``target_id``; :class:`PayloadUnreadable` (never the secret)
        when it is not sealed, is another target's or tenant's, or the tenant's key is destroyed."""
        where = f"the signing secret of target {target_id}"
        if not is_sealed_secret(stored):
            raise PayloadUnreadable(f"{where} is not sealed (stored in plaintext); restart a control or "
                                    "dispatch process of this release to seal it")
        text = stored[len(SECRET_PREFIX):]
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (ValueError, binascii.Error):
            raise PayloadUnreadable(f"{where} is not in the sealed format") from None
        if len(raw) < 12 + 16:
            raise PayloadUnreadable(f"{where} is truncated")
        key = self.data_key(tenant_id, create=False)
        try:
            secret = AESGCM(key).decrypt(raw[:12], raw[12:], _secret_ad(tenant_id, target_id)).decode("utf-8")
        except (InvalidTag, UnicodeDecodeError):
            raise PayloadUnreadable(f"{where} does not authenticate (tampered, or not this target's)") from None
        self._remember(tenant_id, ("s", target_id, 0, stored), secret)
        return secret


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


def open_job_payload_now(store: Any, job: Any) -> Any | None:
    """:func:`open_job_payload` without waiting: its answer (or what it raises) when the tenant's
    data key is cached in this process, else None (the key must be read from the store: call
    :func:`open_job_payload`). Runs on the event loop (decision 0242)."""
    f = job.fire
    cipher = cipher_for(store)
    target = job.target
    signs = getattr(target, "kind", None) == "http"
    hit = cipher.opened_cached(f.tenant_id, f.trigger_id, f.version, job.payload,
                               target.id if signs else None, target.secret if signs else None)
    if hit is not None:
        plain, secret = hit
        if not signs:
            return evolve(job, payload=plain)
        return evolve(job, payload=plain, target=evolve(target, secret=secret))
    if not cipher.has_key(f.tenant_id):
        return None
    plain = cipher.open(f.tenant_id, f.trigger_id, f.version, job.payload)
    if not signs:
        return evolve(job, payload=plain)
    secret = cipher.open_secret(target.tenant_id, target.id, target.secret)
    return evolve(job, payload=plain, target=evolve(target, secret=secret))


async def open_job_payload(store: Any, job: Any) -> Any:
    """The attempt runner's one decryption point: ``job`` with its payload opened. Raises
    :class:`PayloadUnreadable` (a ``ValueError``: the attempt is recorded ``failed`` with it as the
    cause) when the tenant's key is destroyed or the ciphertext does not authenticate. The store is
    read (off the event loop) only when the tenant's data key is not cached."""
    payload: bytes = job.payload
    f = job.fire
    cipher = cipher_for(store)
    target = job.target
    signs = getattr(target, "kind", None) == "http"
    hit = cipher.opened_cached(f.tenant_id, f.trigger_id, f.version, payload,
                               target.id if signs else None, target.secret if signs else None)
    if hit is not None:   # opened before from these very bytes, and the tenant's key is still live
        plain, secret = hit
        if not signs:
            return evolve(job, payload=plain)
        return evolve(job, payload=plain, target=evolve(target, secret=secret))

    def opened() -> Any:
        plain = cipher.open(f.tenant_id, f.trigger_id, f.version, payload)
        if not signs:
            return evolve(job, payload=plain)
        secret = cipher.open_secret(target.tenant_id, target.id, target.secret)
        return evolve(job, payload=plain, target=evolve(target, secret=secret))

    if not cipher.has_key(f.tenant_id):
        # One store read of the tenant's key however many attempts are waiting for it (0206); a
        # failed read (tenant deleted, KEK mismatch) is raised below by ``opened`` in a thread.
        try:
            await once(("data-key", id(cipher), f.tenant_id), lambda: cipher.data_key(f.tenant_id, create=False))
        except Exception:
            pass
    if cipher.has_key(f.tenant_id):
        return opened()
    return await asyncio.to_thread(opened)


def open_secret(store: Any, target: Any) -> str:
    """The signing secret of ``target`` (as read from the store), opened; see
    :meth:`PayloadCipher.open_secret`. May read the store (call off the event loop)."""
    return cipher_for(store).open_secret(target.tenant_id, target.id, target.secret)


def seal_secret(store: Any, tenant_id: str, target_id: str, secret: str) -> str:
    """The sealed, stored form of a new target's signing secret (already sealed: returned as is)."""
    if is_sealed_secret(secret):
        return secret
    return cipher_for(store).seal_secret(tenant_id, target_id, secret)


def sealed_target(store: Any, target: Target) -> Target:
    """``target`` with its signing secret in the sealed, stored form (a ``whsec_`` secret is sealed;
    one already sealed is kept; anything else is refused with ``ValueError``): what the registry
    area requires, since the store holds no key and never seals (decision 0111)."""
    if is_sealed_secret(target.secret):
        return target
    if not target.secret.startswith("whsec_"):
        raise ValueError("secret: a target's signing secret must be a whsec_ secret or sealed")
    return replace(target, secret=seal_secret(store, target.tenant_id, target.id, target.secret))


def seal_stored_secrets(store: Any, batch: int = 200) -> int:
    """Seal every target secret still stored in plaintext (rows written before sealing existed), one
    compare-and-set per row; returns how many were sealed. A secret of a deleted tenant is
    overwritten with an empty string instead (its key is destroyed: nothing may sign with it). Run
    at the start of every control and dispatch process, so no reader ever sees a plaintext secret."""
    cipher = cipher_for(store)
    done = 0
    after = ""
    while True:
        rows = store.registry.unsealed_target_secrets(after, batch)
        for target_id, tenant_id, old in rows:
            try:
                new = cipher.seal_secret(tenant_id, target_id, old)
            except PayloadUnreadable:   # deleted tenant: shred the plaintext instead of sealing it
                new = ""
            if store.registry.replace_target_secret(target_id, old, new):
                done += 1
        if len(rows) < batch:
            break
        after = rows[-1][0]
    if done:
        log.warning("sealed %d target signing secret(s) stored in plaintext by an earlier release", done)
    return done


__all__ = ["KEY_CACHE_S", "MAGIC", "SECRET_PREFIX", "KekError", "PayloadCipher", "PayloadUnreadable", "cipher_for",
           "create_kek", "is_sealed_secret", "kek_file_path", "legacy_kek_paths", "load_kek", "open_job_payload",
           "open_secret", "seal_payload", "seal_secret", "seal_stored_secrets", "sealed_target"]
