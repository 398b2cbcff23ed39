"""Receiver helper for tenants' endpoints: verify a fireledger dispatch and deduplicate it.

Every dispatch is a ``POST`` signed per Standard Webhooks v1 with the target's secret, carrying a
``fireledger-fire-key`` header, a JSON body and (when the deployment publishes keys) a per-attempt
``Authorization: Bearer <jwt>``. :meth:`Receiver.verify` checks all of it and returns a
:class:`Delivery`, or raises :class:`ReceiverError` with a short reason (never the body or secret)
and a suggested HTTP ``status`` (401 for authentication failures, 400 for a malformed body).

A fire is delivered *at least once*: retries and ``unknown`` attempts repeat it under the same fire
key. ``Delivery.duplicate`` is True when this receiver's dedupe store saw the fire key before; answer
those with 200 without redoing the work. The default store is in memory (per process, bounded); for
several processes use a shared store (any object with ``seen(fire_key) -> bool``), ideally recorded
in the same transaction as the work. If the work fails, call :meth:`Receiver.forget` before answering
with an error so the retry is not mistaken for a duplicate.

FastAPI (this module itself needs neither FastAPI nor Flask)::

    from fastapi import FastAPI, HTTPException, Request
    from starlette.concurrency import run_in_threadpool
    from fireledger.receiver import Receiver, ReceiverError, jwks_from_url

    app = FastAPI()
    receiver = Receiver(
        "whsec_...",                                    # the target's secret (or a list, to rotate)
        audience="https://hooks.example.com/fire",      # the target URL, exactly as registered
        issuer="https://fireledger.example.com",       # the deployment's FIRELEDGER_ISSUER
        jwks=jwks_from_url("https://fireledger.example.com/.well-known/jwks.json"),
    )

    @app.post("/fire")
    async def fire(request: Request):
        body = await request.body()                     # the exact bytes that were signed
        try:   # in a thread: the (cached, occasional) JWKS fetch must not block the event loop
            d = await run_in_threadpool(receiver.verify, request.headers, body)
        except ReceiverError as exc:
            raise HTTPException(exc.status, exc.reason) from None
        if d.duplicate:
            return {"ok": True, "duplicate": True}      # already done: answer 200, do not redo it
        try:
            await do_the_work(d.trigger_id, d.scheduled_instant, d.payload)
        except Exception:
            receiver.forget(d.fire_key)                 # so the retry is not taken for a duplicate
            raise
        return {"ok": True}

Flask::

    from flask import Flask, abort, request
    from fireledger.receiver import Receiver, ReceiverError, jwks_from_url

    app = Flask(__name__)
    receiver = Receiver("whsec_...", audience="https://hooks.example.com/fire",
                        issuer="https://fireledger.example.com",
                        jwks=jwks_from_url("https://fireledger.example.com/.well-known/jwks.json"))

    @app.post("/fire")
    def fire():
        try:
            d = receiver.verify(request.headers, request.get_data())
        except ReceiverError as exc:
            abort(exc.status, exc.reason)
        if not d.duplicate:
            try:
                do_the_work(d.trigger_id, d.scheduled_instant, d.payload)
            except Exception:
                receiver.forget(d.fire_key)
                raise
        return {"ok": True, "duplicate": d.duplicate}
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import jwt

from fireledger.dispatch import signing
from fireledger.errors import FireledgerError

__all__ = [
    "ALLOWED_ALGORITHMS",
    "FIRE_KEY_HEADER",
    "Deduper",
    "Delivery",
    "MemoryDeduper",
    "Receiver",
    "ReceiverError",
    "jwks_from_url",
]

FIRE_KEY_HEADER = "fireledger-fire-key"
BODY_SHA256_CLAIM = "fireledger_body_sha256"
ALLOWED_ALGORITHMS = ("EdDSA", "ES256")
_KEY_KINDS: dict[tuple[Any, Any], str] = {("OKP", "Ed25519"): "EdDSA", ("EC", "P-256"): "ES256"}
_MAX_TOKEN = 8192
_MAX_LEEWAY_S = 5.0
_REQUIRED_CLAIMS = ["iss", "aud", "sub", "iat", "nbf", "exp", "jti", BODY_SHA256_CLAIM]


class ReceiverError(FireledgerError):
    """A delivery was refused. ``reason`` is short and never contains the body or a secret;
    ``status`` is the HTTP status to answer with (401 unauthenticated, 400 malformed body)."""

    def __init__(self, reason: str, status: int = 401) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True, slots=True)
class Delivery:
    """One verified dispatch."""

    fire_key: str
    trigger_id: str
    scheduled_instant: datetime  # aware, UTC
    attempt: int
    lane: str
    kind: str
    payload: Any
    duplicate: bool


@runtime_checkable
class Deduper(Protocol):
    def seen(self, fire_key: str) -> bool:
        """Record ``fire_key``; return whether it had been recorded before."""
        ...


class MemoryDeduper:
    """In-memory, thread-safe, bounded (least recently seen keys are evicted) :class:`Deduper`."""

    def __init__(self, max_keys: int = 100_000) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self.max_keys = max_keys
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._keys)

    def seen(self, fire_key: str) -> bool:
        with self._lock:
            if fire_key in self._keys:
                self._keys.move_to_end(fire_key)
                return True
            self._keys[fire_key] = None
            if len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
            return False

    def forget(self, fire_key: str) -> None:
        with self._lock:
            self._keys.pop(fire_key, None)


def jwks_from_url(url: str, timeout_s: float = 5.0, max_bytes: int = 1 << 20) -> Callable[[], dict[str, Any]]:
    """A JWKS fetcher for :class:`Receiver` (stdlib only). Use an ``https`` URL in production."""

    def fetch() -> dict[str, Any]:
        req = urllib.request.Request(url, headers={"accept": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            data = resp.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ValueError("JWKS document too large")
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("JWKS document is not an object")
        return doc

    return fetch


def _parse_jwks(doc: Any) -> dict[str, jwt.PyJWK]:
    """kid -> key for every usable key (Ed25519 for EdDSA, P-256 for ES256, signing use)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError("a JWKS must be an object with a 'keys' list")
    out: dict[str, jwt.PyJWK] = {}
    for jwk in doc["keys"]:
        if not isinstance(jwk, dict):
            continue
        alg = _KEY_KINDS.get((jwk.get("kty"), jwk.get("crv")))
        kid = jwk.get("kid")
        if alg is None or not isinstance(kid, str) or not kid:
            continue
        if jwk.get("alg", alg) != alg or jwk.get("use", "sig") != "sig" or "d" in jwk:
            continue
        try:
            out[kid] = jwt.PyJWK(jwk, algorithm=alg)
        except jwt.PyJWTError:
            continue
    return out


def _number(claims: Mapping[str, Any], name: str) -> float:
    value = claims.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ReceiverError(f"token claim {name} invalid")
    return float(value)


class Receiver:
    """Verifies fireledger dispatches (see the module docstring).

    * ``secret``: the target's Standard Webhooks secret, or a list of them during rotation.
    * ``audience`` / ``issuer``: the token's expected ``aud`` (the target) and ``iss``.
    * ``jwks``: the deployment's public keys (a JWK Set dict, or a callable returning one, e.g.
      :func:`jwks_from_url`). When given, a bearer token is required. A callable is cached for
      ``jwks_ttl_s`` and called again on an unknown ``kid`` (at most every ``jwks_refresh_min_s``),
      so key rotation needs no restart.
    * ``tolerance_s``: the webhook timestamp window, both directions (replay protection).
    * ``leeway_s``: clock leeway for the token's ``exp``/``nbf``/``iat`` (at most 5 s).
    * ``dedupe``: where fire keys are remembered (default :class:`MemoryDeduper`).
    """

    def __init__(
        self,
        secret: str | list[str],
        *,
        audience: str,
        issuer: str,
        jwks: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        tolerance_s: int = signing.DEFAULT_TOLERANCE_S,
        dedupe: Deduper | None = None,
        leeway_s: float = _MAX_LEEWAY_S,
        jwks_ttl_s: float = 300.0,
        jwks_refresh_min_s: float = 10.0,
    ) -> None:
        secrets = [secret] if isinstance(secret, str) else list(secret)
        if not secrets:
            raise ValueError("at least one secret is required")
        for s in secrets:
            signing.secret_key(s)  # ValueError without echoing the secret
        if not isinstance(audience, str) or not audience or not isinstance(issuer, str) or not issuer:
            raise ValueError("audience and issuer must be non-empty strings")
        if not 0 <= leeway_s <= _MAX_LEEWAY_S:
            raise ValueError("leeway_s must be between 0 and 5 seconds")
        if tolerance_s <= 0:
            raise ValueError("tolerance_s must be > 0")
        self._secrets = secrets
        self.audience = audience
        self.issuer = issuer
        self.tolerance_s = tolerance_s
        self.leeway_s = float(leeway_s)
        self.dedupe: Deduper = dedupe if dedupe is not None else MemoryDeduper()
        self._fetch: Callable[[], dict[str, Any]] | None = None
        self._keys: dict[str, jwt.PyJWK] | None = None
        self._fetched_at = float("-inf")
        self._jwks_ttl_s = jwks_ttl_s
        self._jwks_refresh_min_s = jwks_refresh_min_s
        self._jwks_lock = threading.Lock()
        self.requires_token = jwks is not None
        if callable(jwks):
            self._fetch = jwks
        elif jwks is not None:
            self._keys = _parse_jwks(jwks)
            if not self._keys:
                raise ValueError("the JWKS has no usable EdDSA (Ed25519) or ES256 (P-256) key with a kid")

    def __repr__(self) -> str:
        return f"Receiver(audience={self.audience!r}, issuer={self.issuer!r}, token={self.requires_token})"

    # -- public -----------------------------------------------------------------------------------

    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None) -> Delivery:
        """Verify one request (headers looked up case-insensitively; ``body`` the exact raw bytes)
        and record its fire key. ``now`` (epoch seconds) defaults to the current time."""
        if now is None:
            now = time.time()
        if not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError("body must be the raw request bytes")
        body = bytes(body)
        lower: dict[str, str] = {}
        for name, value in headers.items():
            lower.setdefault(name.lower(), value)

        # (a) Standard Webhooks signature over the exact body.
        try:
            signing.verify(self._secrets, lower, body, now=now, tolerance_s=self.tolerance_s)
        except signing.SignatureError as exc:
            raise ReceiverError(exc.reason) from None
        fire_key = lower.get(FIRE_KEY_HEADER, "")
        if not fire_key:
            raise ReceiverError(f"missing header {FIRE_KEY_HEADER}")

        # (b) The per-attempt token.
        claims = self._verify_token(lower, body, fire_key, now) if self.requires_token else None

        # (c) The body.
        delivery = _parse_body(body, fire_key)
        if claims is not None:
            if claims["jti"] != f"{fire_key}.{delivery.attempt}":
                raise ReceiverError("token jti does not match the attempt")
            if claims["sub"] != delivery.trigger_id:
                raise ReceiverError("token subject does not match the trigger")

        # (d) Deduplicate, only once everything checked out.
        if self.dedupe.seen(fire_key):
            delivery = _replace_duplicate(delivery)
        return delivery

    def forget(self, fire_key: str) -> None:
        """Un-record ``fire_key`` (the work failed; the retry must not count as a duplicate).
        A no-op for dedupe stores without a ``forget`` method."""
        fn = getattr(self.dedupe, "forget", None)
        if callable(fn):
            fn(fire_key)

    # -- token ------------------------------------------------------------------------------------

    def _key_for(self, kid: str) -> jwt.PyJWK | None:
        if self._fetch is None:
            assert self._keys is not None
            return self._keys.get(kid)
        mono = time.monotonic()
        keys = self._keys
        stale = keys is None or mono - self._fetched_at >= self._jwks_ttl_s
        missing = keys is not None and kid not in keys and mono - self._fetched_at >= self._jwks_refresh_min_s
        if stale or missing:
            with self._jwks_lock:
                if self._keys is keys:  # nobody refreshed while we waited
                    try:
                        self._keys = _parse_jwks(self._fetch())
                    except Exception:
                        if self._keys is None:
                            raise ReceiverError("JWKS unavailable", 503) from None
                        # keep serving from the cached set; try again after the minimum interval
                    self._fetched_at = time.monotonic()
            keys = self._keys
        assert keys is not None
        return keys.get(kid)

    def _verify_token(self, lower: Mapping[str, str], body: bytes, fire_key: str, now: float) -> dict[str, Any]:
        auth = lower.get("authorization", "")
        scheme, _, token = auth.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ReceiverError("missing bearer token")
        if len(token) > _MAX_TOKEN:
            raise ReceiverError("token too large")
        header = _token_header(token)
        alg = header.get("alg")
        if alg not in ALLOWED_ALGORITHMS:
            raise ReceiverError("token algorithm not allowed")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise ReceiverError("token has no kid")
        key = self._key_for(kid)
        if key is None:
            raise ReceiverError("unknown token key id")
        if key.algorithm_name != alg:
            raise ReceiverError("token algorithm does not match its key")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                options={
                    # Time claims are checked below against the injected ``now``.
                    "verify_exp": False, "verify_nbf": False, "verify_iat": False,
                    "strict_aud": True, "require": _REQUIRED_CLAIMS,
                },
            )
        except jwt.InvalidSignatureError:
            raise ReceiverError("token signature mismatch") from None
        except jwt.InvalidAudienceError:
            raise ReceiverError("token audience mismatch") from None
        except jwt.InvalidIssuerError:
            raise ReceiverError("token issuer mismatch") from None
        except jwt.MissingRequiredClaimError as exc:
            raise ReceiverError(f"token missing claim {exc.claim}") from None
        except jwt.InvalidAlgorithmError:
            raise ReceiverError("token algorithm not allowed") from None
        except jwt.PyJWTError:
            raise ReceiverError("invalid token") from None

        leeway = self.leeway_s
        if now > _number(claims, "exp") + leeway:
            raise ReceiverError("token expired")
        if now + leeway < _number(claims, "nbf"):
            raise ReceiverError("token not yet valid")
        if now + leeway < _number(claims, "iat"):
            raise ReceiverError("token issued in the future")
        digest = claims.get(BODY_SHA256_CLAIM)
        if not isinstance(digest, str) or not hmac.compare_digest(
            digest.encode("ascii", "replace"), hashlib.sha256(body).hexdigest().encode("ascii")
        ):
            raise ReceiverError("body does not match token")
        jti = claims.get("jti")
        if not isinstance(jti, str) or not jti.startswith(fire_key + "."):
            raise ReceiverError("token jti does not match the fire key")
        if not isinstance(claims.get("sub"), str):
            raise ReceiverError("token claim sub invalid")
        return claims


def _token_header(token: str) -> dict[str, Any]:
    """The unverified JOSE header of a compact JWS (only to pick the key; PyJWT re-checks it)."""
    parts = token.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise ReceiverError("malformed token")
    try:
        raw = base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4))
        header = json.loads(raw)
    except (ValueError, TypeError, RecursionError):
        raise ReceiverError("malformed token") from None
    if not isinstance(header, dict):
        raise ReceiverError("malformed token")
    return header


def _parse_body(body: bytes, fire_key: str) -> Delivery:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ReceiverError("body is not JSON", 400) from None
    if not isinstance(doc, dict):
        raise ReceiverError("body is not a JSON object", 400)
    if doc.get("fire_key") != fire_key:
        raise ReceiverError("fire key header does not match the body")
    fields: dict[str, Any] = {}
    for name in ("trigger_id", "lane", "kind", "scheduled_instant"):
        value = doc.get(name)
        if not isinstance(value, str) or not value:
            raise ReceiverError(f"body field {name} missing or invalid", 400)
        fields[name] = value
    attempt = doc.get("attempt")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ReceiverError("body field attempt missing or invalid", 400)
    if "payload" not in doc:
        raise ReceiverError("body field payload missing", 400)
    try:
        instant = datetime.fromisoformat(fields["scheduled_instant"])
    except ValueError:
        raise ReceiverError("body field scheduled_instant is not RFC 3339", 400) from None
    if instant.tzinfo is None:
        raise ReceiverError("body field scheduled_instant has no offset", 400)
    return Delivery(
        fire_key=fire_key,
        trigger_id=fields["trigger_id"],
        scheduled_instant=instant,
        attempt=attempt,
        lane=fields["lane"],
        kind=fields["kind"],
        payload=doc["payload"],
        duplicate=False,
    )


def _replace_duplicate(d: Delivery) -> Delivery:
    return Delivery(d.fire_key, d.trigger_id, d.scheduled_instant, d.attempt, d.lane, d.kind, d.payload, True)
