"""Per-attempt workload credentials: a short-lived EdDSA JWT for every HTTP attempt.

Every attempt carries ``Authorization: Bearer <jwt>`` beside its Standard Webhooks signature. The
signature proves the request came from someone holding the target's shared secret; the token proves
it came from *this* fireledger deployment (asymmetric, verifiable from public keys alone), for *this*
target, fire and attempt, and only until the attempt's deadline.

Token
-----
* Header ``{"alg": "EdDSA", "typ": "JWT", "kid": <kid>}``; ``kid`` is the RFC 7638 JWK thumbprint
  (SHA-256, base64url) of the signing key's public JWK.
* Claims ``iss`` (the deployment's issuer URL), ``aud`` (the target), ``sub`` (the trigger id),
  ``iat`` = ``nbf`` = the attempt's start, ``exp`` = the attempt's deadline, ``jti`` =
  ``f"{fire_key}.{attempt}"`` and ``fireledger_body_sha256``: the lower-case hex SHA-256 of the exact
  request body, which binds the token to the body (a token lifted onto another body is useless).

Keys
----
:class:`KeyRing` holds Ed25519 signing keys in one of three states:

* ``current``: signs new tokens and is published. Exactly one.
* ``next``: published but not yet signing (:meth:`KeyRing.stage`), so receivers that cache the JWKS
  learn it before the first token signed with it arrives.
* ``retired``: no longer signs; stays published until ``publish_until`` (rotation time + overlap) so
  tokens already minted keep verifying; :meth:`KeyRing.prune` drops it afterwards.

Rotation without downtime: ``stage`` → wait at least the receivers' JWKS cache time → ``rotate``
(promotes the staged key; without one it creates and promotes a new key at once, which receivers
handle by refetching the JWKS on an unknown ``kid``) → ``prune`` once the overlap has passed.

The ring file (:meth:`KeyRing.save`) is JSON holding the *private* JWKs; it is written atomically
with mode 0600. :func:`mint` reads no clock: the caller passes the times.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from nacl.bindings import crypto_sign, crypto_sign_seed_keypair

__all__ = [
    "ALGORITHM",
    "AUTHORIZATION_HEADER",
    "BODY_SHA256_CLAIM",
    "DEFAULT_OVERLAP_S",
    "JWKS_PATH",
    "KeyRing",
    "KeyRingFile",
    "SigningKey",
    "authorization_header",
    "body_sha256",
    "mint",
]

log = logging.getLogger("fireledger.credentials")

ALGORITHM = "EdDSA"
AUTHORIZATION_HEADER = "Authorization"
BODY_SHA256_CLAIM = "fireledger_body_sha256"
JWKS_PATH = "/.well-known/jwks.json"
DEFAULT_OVERLAP_S = 86_400
_FORMAT = "fireledger-keyring/1"
_HEX64 = re.compile(r"[0-9a-f]{64}")

KeyState = Literal["current", "next", "retired"]


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64u_decode(text: str) -> bytes:
    if not isinstance(text, str) or not text or "=" in text:
        raise ValueError("not unpadded base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise ValueError("not unpadded base64url") from None


def body_sha256(body: bytes) -> str:
    """The ``fireledger_body_sha256`` claim of ``body``: lower-case hex SHA-256 of the exact bytes."""
    return hashlib.sha256(body).hexdigest()


def authorization_header(token: str) -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}``, ready for ``HttpRequest.extra_headers``."""
    return {AUTHORIZATION_HEADER: f"Bearer {token}"}


def _thumbprint(x: str) -> str:
    """RFC 7638 thumbprint of an Ed25519 public JWK: required members in lexicographic order."""
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"), sort_keys=True)
    return _b64u(hashlib.sha256(canonical.encode("ascii")).digest())


@dataclass(slots=True, eq=False)
class SigningKey:
    """One Ed25519 key of a :class:`KeyRing`. The private key is kept out of ``repr``."""

    kid: str
    x: str
    private: Ed25519PrivateKey
    state: KeyState
    created_s: int | None = None
    retired_s: int | None = None
    publish_until_s: int | None = None
    header_b64: bytes = b""  # serialized, base64url token header for this kid (cached)
    #: libsodium's 64-byte form of the same private key (seed ‖ public key): what :func:`mint`
    #: signs with. Ed25519 is deterministic (RFC 8032), so libsodium's signature is byte for byte
    #: the one ``private.sign`` makes, at ≈60 % of its CPU (decision 0254). Kept out of ``repr``.
    sodium_sk: bytes = b""

    def __repr__(self) -> str:
        return (f"SigningKey(kid={self.kid!r}, state={self.state!r}, created_s={self.created_s}, "
                f"retired_s={self.retired_s}, publish_until_s={self.publish_until_s})")

    @classmethod
    def from_private(cls, private: Ed25519PrivateKey, state: KeyState, created_s: int | None) -> SigningKey:
        public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        x = _b64u(public)
        kid = _thumbprint(x)
        header = json.dumps({"alg": ALGORITHM, "typ": "JWT", "kid": kid}, separators=(",", ":"))
        sodium_public, sodium_sk = crypto_sign_seed_keypair(
            private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()))
        if sodium_public != public:   # the two libraries must hold the same key
            raise ValueError("libsodium derived another public key from this Ed25519 private key")
        return cls(kid=kid, x=x, private=private, state=state, created_s=created_s,
                   header_b64=_b64u(header.encode("ascii")).encode("ascii"), sodium_sk=sodium_sk)

    def public_jwk(self) -> dict[str, str]:
        return {"kty": "OKP", "crv": "Ed25519", "x": self.x, "kid": self.kid, "alg": ALGORITHM, "use": "sig"}

    def private_jwk(self) -> dict[str, Any]:
        d = self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        out: dict[str, Any] = {**self.public_jwk(), "d": _b64u(d), "fireledger_state": self.state}
        out["fireledger_created_s"] = self.created_s
        out["fireledger_retired_s"] = self.retired_s
        out["fireledger_publish_until_s"] = self.publish_until_s
        return out

    def published_at(self, now_s: int | None) -> bool:
        if self.state != "retired" or now_s is None:
            return True
        return self.publish_until_s is not None and now_s < self.publish_until_s


def _opt_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer or null")
    return value


def _check_time(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative int (epoch seconds)")


class KeyRing:
    """Ed25519 signing keys: one ``current`` (signs), optionally one ``next`` (published, staged),
    and ``retired`` keys still published until their window ends. See the module docstring.

    A ring is safe to read from many threads while one thread rotates it (:func:`mint` reads the
    current key with a single attribute access). Mutations are serialized by an internal lock.
    """

    def __init__(self, keys: list[SigningKey]) -> None:
        currents = [k for k in keys if k.state == "current"]
        if len(currents) != 1:
            raise ValueError("a key ring needs exactly one current key")
        if sum(1 for k in keys if k.state == "next") > 1:
            raise ValueError("a key ring holds at most one staged (next) key")
        kids = [k.kid for k in keys]
        if len(set(kids)) != len(kids):
            raise ValueError("duplicate kid in key ring")
        self._keys: list[SigningKey] = list(keys)
        self.current: SigningKey = currents[0]
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"KeyRing(current={self.current.kid!r}, keys={len(self._keys)})"

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def generate(cls, now_s: int | None = None) -> KeyRing:
        """A ring with one fresh current key (``now_s`` is only recorded as its creation time)."""
        return cls([SigningKey.from_private(Ed25519PrivateKey.generate(), "current", now_s)])

    @classmethod
    def from_dict(cls, doc: Any) -> KeyRing:
        """Parse the ring file's JSON document; ``ValueError`` names the problem, never key bytes."""
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise ValueError(f"not a key ring document (expected format {_FORMAT!r})")
        raw = doc.get("keys")
        if not isinstance(raw, list) or not raw:
            raise ValueError("key ring has no keys")
        keys: list[SigningKey] = []
        for i, jwk in enumerate(raw):
            where = f"key ring entry {i}"
            if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
                raise ValueError(f"{where}: only OKP/Ed25519 keys are supported")
            try:
                d = _b64u_decode(jwk.get("d"))  # type: ignore[arg-type]
            except ValueError:
                raise ValueError(f"{where}: 'd' is not base64url") from None
            if len(d) != 32:
                raise ValueError(f"{where}: 'd' must be 32 bytes")
            state = jwk.get("fireledger_state")
            if state not in ("current", "next", "retired"):
                raise ValueError(f"{where}: fireledger_state must be current, next or retired")
            key = SigningKey.from_private(
                Ed25519PrivateKey.from_private_bytes(d), state, _opt_int(jwk.get("fireledger_created_s"), where)
            )
            if "x" in jwk and jwk["x"] != key.x:
                raise ValueError(f"{where}: public key 'x' does not match the private key")
            if "kid" in jwk and jwk["kid"] != key.kid:
                raise ValueError(f"{where}: 'kid' is not the RFC 7638 thumbprint of the key")
            key.retired_s = _opt_int(jwk.get("fireledger_retired_s"), where)
            key.publish_until_s = _opt_int(jwk.get("fireledger_publish_until_s"), where)
            if state == "retired" and key.publish_until_s is None:
                raise ValueError(f"{where}: a retired key needs fireledger_publish_until_s")
            keys.append(key)
        return cls(keys)

    def to_dict(self) -> dict[str, Any]:
        """The ring file's JSON document (contains private keys)."""
        with self._lock:
            return {"format": _FORMAT, "keys": [k.private_jwk() for k in self._keys]}

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeyRing:
        """Read a ring file. Refuses (``ValueError`` naming the file and the ``chmod 600`` that fixes
        it) a file that group or others may access: its private keys sign every attempt."""
        p = Path(path)
        with p.open("rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ValueError(f"{p}: the key ring is accessible by group/others (mode "
                                 f"{stat.S_IMODE(mode):04o}); fix it with: chmod 600 {p}")
            data = fh.read()
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError(f"key ring file {p} is not valid JSON") from None
        return cls.from_dict(doc)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ring atomically (temp file, fsync, rename) with mode 0600."""
        p = Path(path)
        tmp = _write_private_temp(p, self.to_dict())
        try:
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(p.parent)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str], now_s: int | None = None) -> KeyRing:
        """Load the ring at ``path``, creating it (one fresh key) if absent.

        Creation is atomic and race-free: when several processes start at once, exactly one file is
        created and all of them end up with its keys.
        """
        p = Path(path)
        if p.exists():
            return cls.load(p)
        ring = cls.generate(now_s)
        tmp = _write_private_temp(p, ring.to_dict())
        try:
            os.link(tmp, p)  # fails if another process created it first
        except FileExistsError:
            return cls.load(p)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        _fsync_dir(p.parent)
        return ring

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def keys(self) -> tuple[SigningKey, ...]:
        return tuple(self._keys)

    @property
    def staged(self) -> SigningKey | None:
        return next((k for k in self._keys if k.state == "next"), None)

    def get(self, kid: str) -> SigningKey | None:
        return next((k for k in self._keys if k.kid == kid), None)

    def stage(self, now_s: int | None = None) -> str:
        """Publish a new key that does not sign yet (idempotent: returns the staged kid if any)."""
        with self._lock:
            staged = next((k for k in self._keys if k.state == "next"), None)
            if staged is None:
                staged = SigningKey.from_private(Ed25519PrivateKey.generate(), "next", now_s)
                self._keys.append(staged)
            return staged.kid

    def rotate(self, now_s: int, overlap_s: int = DEFAULT_OVERLAP_S) -> str:
        """Make a new key current and retire the previous one; return the new kid.

        The staged key (:meth:`stage`) is promoted if there is one, else a fresh key is made. The
        previous key stops signing now but stays in :meth:`jwks` until ``now_s + overlap_s``;
        ``overlap_s`` must cover the longest token lifetime plus receivers' clock leeway.
        """
        _check_time(now_s, "now_s")
        if isinstance(overlap_s, bool) or not isinstance(overlap_s, int) or overlap_s < 0:
            raise ValueError("overlap_s must be a non-negative int")
        with self._lock:
            new = next((k for k in self._keys if k.state == "next"), None)
            if new is None:
                new = SigningKey.from_private(Ed25519PrivateKey.generate(), "next", now_s)
                self._keys.append(new)
            old = self.current
            old.state = "retired"
            old.retired_s = now_s
            old.publish_until_s = now_s + overlap_s
            new.state = "current"
            self.current = new  # one attribute store: concurrent mint() sees old or new, both valid
            return new.kid

    def prune(self, now_s: int) -> list[str]:
        """Drop retired keys whose publish window has ended (``now_s >= publish_until``)."""
        _check_time(now_s, "now_s")
        with self._lock:
            gone = [k for k in self._keys if not k.published_at(now_s)]
            self._keys = [k for k in self._keys if k.published_at(now_s)]
            return [k.kid for k in gone]

    def jwks(self, now_s: int | None = None) -> dict[str, list[dict[str, str]]]:
        """The public JWK Set to serve at ``/.well-known/jwks.json``: current, staged and retired
        keys still inside their window (all retired keys not yet pruned when ``now_s`` is None)."""
        with self._lock:
            return {"keys": [k.public_jwk() for k in self._keys if k.published_at(now_s)]}


def _write_private_temp(target: Path, doc: dict[str, Any]) -> str:
    data = json.dumps(doc, indent=1, sort_keys=True).encode("ascii") + b"\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o600)  # mkstemp already creates 0600; be explicit
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class KeyRingFile:
    """A ring file shared by processes on one host: :meth:`ring` reloads it when it changes (a
    ``stat`` per call), :meth:`rotate`/:meth:`stage`/:meth:`prune` edit it under an advisory lock.

    The dispatch plane calls ``ring()`` before minting (cheap), the control plane calls
    ``ring().jwks(now_s)`` to serve ``/.well-known/jwks.json``; an operator command rotates.
    """

    def __init__(self, path: str | os.PathLike[str], now_s: int | None = None) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        with self._locked():
            self._ring = KeyRing.load_or_create(self.path, now_s)
        self._sig = self._stat()
        self._checked = -1e18

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def ring(self, max_age_s: float = 0.0) -> KeyRing:
        """The ring as currently on disk (reloaded only when the file changed). ``max_age_s`` > 0
        lets a hot caller skip the ``stat`` when the file was looked at that recently (the attempt
        runner: a rotation is seen within that time, and the published key set overlaps old and
        new keys far longer, so a token minted meanwhile still verifies)."""
        if max_age_s > 0:
            now = time.monotonic()
            if now - self._checked < max_age_s:
                return self._ring
            self._checked = now
        sig = self._stat()
        if sig is not None and sig != self._sig:
            with self._lock:
                if sig != self._sig:
                    self._ring = KeyRing.load(self.path)
                    self._sig = sig
        return self._ring

    def _edit(self, fn: Any) -> Any:
        with self._lock, self._locked():
            ring = KeyRing.load(self.path)
            out = fn(ring)
            ring.save(self.path)
            self._ring, self._sig = ring, self._stat()
            return out

    def stage(self, now_s: int | None = None) -> str:
        return self._edit(lambda r: r.stage(now_s))  # type: ignore[no-any-return]

    def rotate(self, now_s: int, overlap_s: int = DEFAULT_OVERLAP_S) -> str:
        return self._edit(lambda r: r.rotate(now_s, overlap_s))  # type: ignore[no-any-return]

    def prune(self, now_s: int) -> list[str]:
        return self._edit(lambda r: r.prune(now_s))  # type: ignore[no-any-return]


#: A JSON string literal exactly as ``json.dumps`` writes it with ``ensure_ascii=True`` (the C encoder).
_json_str: Any = json.encoder.encode_basestring_ascii


def mint(
    ring: KeyRing,
    *,
    issuer: str,
    audience: str,
    subject: str,
    fire_key: str,
    attempt: int,
    body_sha256: str,
    now_s: int,
    expires_s: int,
) -> str:
    """A compact EdDSA JWT for one attempt, signed by the ring's current key (see module docstring).

    ``body_sha256`` is :func:`body_sha256` of the exact body sent; ``now_s`` is the attempt's start
    and ``expires_s`` its deadline (epoch seconds, ``expires_s > now_s``). Reads no clock.
    Raises ``ValueError`` for invalid arguments.
    """
    if not (isinstance(issuer, str) and issuer and isinstance(audience, str) and audience
            and isinstance(subject, str) and subject and isinstance(fire_key, str) and fire_key):
        raise ValueError("issuer, audience, subject and fire_key must be non-empty strings")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ValueError("attempt must be a non-negative int")
    if not isinstance(body_sha256, str) or not _HEX64.fullmatch(body_sha256):
        raise ValueError("body_sha256 must be 64 lower-case hex digits")
    if (isinstance(now_s, bool) or not isinstance(now_s, int) or now_s < 0
            or isinstance(expires_s, bool) or not isinstance(expires_s, int) or expires_s <= now_s):
        raise ValueError("now_s and expires_s must be ints with 0 <= now_s < expires_s")
    key = ring.current
    # The bytes of json.dumps({"iss": …, "aud": …, "sub": …, "iat": …, "nbf": …, "exp": …, "jti": …,
    # BODY_SHA256_CLAIM: …}, separators=(",", ":"), ensure_ascii=True), written out (decision 0207).
    claims = (f'{{"iss":{_json_str(issuer)},"aud":{_json_str(audience)},"sub":{_json_str(subject)},'
              f'"iat":{int(now_s)},"nbf":{int(now_s)},"exp":{int(expires_s)},'
              f'"jti":{_json_str(f"{fire_key}.{attempt}")},"{BODY_SHA256_CLAIM}":"{body_sha256}"}}')
    signing_input = key.header_b64 + b"." + base64.urlsafe_b64encode(claims.encode("ascii")).rstrip(b"=")
    # libsodium's combined form: the 64-byte signature, then the message (decision 0254).
    signature = base64.urlsafe_b64encode(crypto_sign(signing_input, key.sodium_sk)[:64]).rstrip(b"=")
    return (signing_input + b"." + signature).decode("ascii")
