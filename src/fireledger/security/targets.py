"""Target ownership: the HTTP challenge, and the checks at definition and at dispatch (invariant 12).

**Challenge.** A target's origin proves ownership by answering
``GET <scheme>://<host>[:port]/.well-known/fireledger-verification/<token>`` with status 200 and a
body that is exactly the target's verification token (surrounding whitespace ignored). The fetch
goes through the egress guard (:mod:`fireledger.security.egress`), follows no redirect, sends no
cookie or credential, reads at most :data:`CHALLENGE_MAX_BYTES` and gives up after
:data:`CHALLENGE_TIMEOUT_S`. Success makes the target ``verified`` until now +
:data:`VERIFICATION_TTL_S` (30 days; verify again to extend); failure makes it ``failed`` with the
cause. (The DNS TXT method is designed in docs/decisions/0041.)

**Checks.** :func:`verification_problem` is the one rule, used at definition time (a trigger may
point only at a verified, unexpired target of its tenant) and again by the attempt runner
(:func:`dispatch_refusal`) before each attempt, which reads the target's state from the store (cached
for at most :data:`DISPATCH_CACHE_S` per process) so a lapsed or failed verification stops delivery.
Targets of kinds other than ``http`` (queues, in-process callables) need no verification.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from fireledger.domain.keys import from_us
from fireledger.recurrence import format_instant

from .egress import EgressPolicy, EgressRefused, guarded_connector

WELL_KNOWN = "/.well-known/fireledger-verification/"
VERIFICATION_TTL_S = 30 * 86_400
CHALLENGE_TIMEOUT_S = 10.0
CHALLENGE_MAX_BYTES = 1024
DISPATCH_CACHE_S = 1.0

_log = logging.getLogger("fireledger.dispatch")


def challenge_url(target_url: str, token: str) -> str:
    """The challenge URL on the origin of ``target_url``."""
    parts = urlsplit(target_url)
    return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}{token}"


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    out = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return out[:200]


async def fetch_challenge(target_url: str, token: str, policy: EgressPolicy, *,
                          timeout_s: float = CHALLENGE_TIMEOUT_S) -> str | None:
    """Fetch the challenge for ``token`` on ``target_url``'s origin: None when it proves ownership,
    else a one-line cause (never the response body)."""
    url = challenge_url(target_url, token)
    try:
        async with aiohttp.ClientSession(
            connector=guarded_connector(policy, limit=1),
            cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            headers={"user-agent": "fireledger-verification"},
        ) as session, session.get(url, allow_redirects=False) as resp:
            if 300 <= resp.status < 400:
                return f"the challenge at {url} answered HTTP {resp.status}: redirects are not followed"
            if resp.status != 200:
                return f"the challenge at {url} answered HTTP {resp.status}, expected 200"
            body = b""
            while len(body) <= CHALLENGE_MAX_BYTES:
                chunk = await resp.content.read(CHALLENGE_MAX_BYTES + 1 - len(body))
                if not chunk:
                    break
                body += chunk
    except EgressRefused as exc:
        return str(exc)
    except TimeoutError:
        return f"the challenge at {url} did not answer within {timeout_s:g}s"
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return f"the challenge at {url} could not be fetched ({_short(exc)})"
    if len(body) > CHALLENGE_MAX_BYTES:
        return f"the challenge at {url} answered more than {CHALLENGE_MAX_BYTES} bytes"
    if body.strip() != token.encode("ascii", "replace"):
        return f"the challenge at {url} does not answer the verification token"
    return None


def verification_problem(t: Any, now_us: int) -> str | None:
    """Why target ``t`` (a :class:`~fireledger.store.trust.TargetTrust`) may not be used now, or None.
    Only ``http`` targets need verification; a verification without expiry never lapses."""
    if t.deleted_us is not None:
        return f"target {t.id} was deleted"
    if t.kind != "http":
        return None
    if t.state != "verified":
        why = f" ({t.error})" if getattr(t, "error", None) else ""
        return (f"target {t.id}'s ownership is not verified (state {t.state}{why}); serve its token at "
                f"{WELL_KNOWN}<token> on its origin, then POST /v1/targets/{t.id}/verify")
    if t.expires_us is not None and t.expires_us <= now_us:
        return (f"target {t.id}'s ownership verification lapsed at {format_instant(from_us(t.expires_us))}; "
                f"POST /v1/targets/{t.id}/verify to verify it again")
    return None


def target_write_problem(store: Any, tenant_id: str, target_id: str, now_us: int) -> str | None:
    """The problem with pointing a trigger of ``tenant_id`` at ``target_id`` now, or None. Another
    tenant's target is reported exactly like a missing one."""
    t = store.target_trust(target_id)
    if t is None or t.tenant_id != tenant_id or t.deleted_us is not None:
        return "no such target"
    return verification_problem(t, now_us)


_CACHE: dict[tuple[int, str], tuple[Any, float]] = {}
_CACHE_LOCK = threading.Lock()


def _cached_trust(store: Any, target_id: str) -> tuple[bool, Any]:
    key = (id(store), target_id)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is not None and hit[1] > time.monotonic():
        return True, hit[0]
    return False, None


def _load_trust(store: Any, target_id: str) -> Any:
    t = store.target_trust(target_id)
    with _CACHE_LOCK:
        if len(_CACHE) > 10_000:
            _CACHE.clear()
        _CACHE[(id(store), target_id)] = (t, time.monotonic() + DISPATCH_CACHE_S)
    return t


async def dispatch_refusal(store: Any, target: Any, now_us: int) -> str | None:
    """The attempt runner's re-check before an attempt: why ``target`` must not be called now (its
    verification is missing, failed or lapsed, or it was deleted), or None. The store is read off the
    event loop, at most once per target per :data:`DISPATCH_CACHE_S`."""
    if getattr(target, "kind", "http") != "http":
        return None
    found, t = _cached_trust(store, target.id)
    if not found:
        t = await asyncio.to_thread(_load_trust, store, target.id)
    if t is None:
        return f"target {target.id} does not exist"
    return verification_problem(t, now_us)


async def admit(store: Any, job: Any, now_us: int) -> tuple[Any, str | None]:
    """The attempt runner's trust gate, called once per attempt before anything is sent:
    ``(job, None)`` with the payload decrypted (the one decryption point, :mod:`.envelope`), or
    ``(job, cause)`` when the attempt must not be made — the target's verification is missing, failed
    or lapsed, the target is gone, or the payload cannot be opened (the tenant's key was destroyed, or
    the key-encryption key does not unwrap it: ``KekError``, never raised from here).
    The runner records such an attempt ``failed`` with the cause; the target is not called."""
    from .envelope import KekError, PayloadUnreadable, open_job_payload

    refusal = await dispatch_refusal(store, job.target, now_us)
    if refusal is not None:
        return job, f"not sent: {refusal}"
    try:
        return await open_job_payload(store, job), None
    except PayloadUnreadable as exc:
        return job, f"not sent: {exc}"
    except KekError as exc:
        # The deployment's key-encryption key cannot unwrap this tenant's key: recorded with a cause
        # (no path or key detail: the tenant reads it), the detail logged for the operator.
        _log.error("tenant %s: the payload key cannot be unwrapped: %s", job.fire.tenant_id, exc)
        return job, ("not sent: the payload cannot be opened: this deployment's key-encryption key does "
                     "not unwrap the tenant's data key (KekError)")


def forget_cached(target_id: str | None = None) -> None:
    """Drop cached dispatch-time verification states (tests, and after a local change)."""
    with _CACHE_LOCK:
        if target_id is None:
            _CACHE.clear()
        else:
            for k in [k for k in _CACHE if k[1] == target_id]:
                del _CACHE[k]


__all__ = [
    "CHALLENGE_MAX_BYTES",
    "CHALLENGE_TIMEOUT_S",
    "DISPATCH_CACHE_S",
    "VERIFICATION_TTL_S",
    "WELL_KNOWN",
    "admit",
    "challenge_url",
    "dispatch_refusal",
    "fetch_challenge",
    "forget_cached",
    "target_write_problem",
    "verification_problem",
]
