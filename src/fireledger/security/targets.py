"""Target ownership: the HTTP challenge, and the checks at definition and at dispatch (invariant 12).

**Challenge** (docs/decisions/0041, 0088). A target's origin proves ownership by answering
``GET <scheme>://<host>[:port]/.well-known/fireledger-verification/<token>`` with status 200 and a
body that is exactly the target's *key authorisation* (surrounding whitespace ignored)::

    response = token + "." + base64url_nopad(HMAC-SHA256(K, token || 0x00 || target id))

where ``K`` is the deployment's purpose key ``derived_key(store, "target-verification")``
(:mod:`fireledger.security.derived`; the database does not hold it). The API shows ``response`` to
the target's tenant; it is not in the request, so an origin that echoes the path (or any part of the
request) cannot produce it. The fetch goes through the egress guard (:mod:`fireledger.security.egress`,
also its https rule), follows no redirect, sends no cookie or credential, reads at most
:data:`CHALLENGE_MAX_BYTES` and gives up after :data:`CHALLENGE_TIMEOUT_S`. Success makes the target
``verified`` until now + :data:`VERIFICATION_TTL_S` (30 days, ``FIRELEDGER_VERIFICATION_VALIDITY_S``;
renewed automatically during its last 7 days, :mod:`fireledger.reverify`); failure makes it
``failed`` with the cause. The DNS TXT method is :mod:`.dnsverify`.

**Address pin** (decision 0089). Over plain http nothing binds a connection to the name that was
verified, so for a plain-http target whose host is a name :func:`prove_ownership` fetches the
challenge from each address the name resolves to (at most :data:`MAX_PINNED_ADDRESSES`) and records
those that answered; an attempt then connects only to those (:func:`admit` sets
``DispatchJob.pinned_addresses``; the connection pool refuses a name that resolves to none of them,
``failed`` with a cause, nothing sent). Such a target verified without recorded addresses is treated
as unverified. An ``https`` target needs no pin (TLS authenticates the name), nor does an IP literal.

**Checks.** :func:`verification_problem` is the one rule, used at definition time (a trigger may
point only at a verified, unexpired target of its tenant) and again by the attempt runner
(:func:`dispatch_refusal`) before each attempt, which reads the target's state from the store (cached
for at most :data:`DISPATCH_CACHE_S` per process) so a lapsed or failed verification stops delivery.
Targets of kinds other than ``http`` (queues, in-process callables) need no verification.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import ipaddress
import logging
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from fireledger.domain.evolve import evolve
from fireledger.domain.keys import from_us
from fireledger.recurrence import format_instant

from .egress import EgressPolicy, EgressRefused, GuardedResolver, guarded_connector
from .envelope import KekError, PayloadUnreadable, open_job_payload, open_job_payload_now
from .flight import once

WELL_KNOWN = "/.well-known/fireledger-verification/"
VERIFICATION_TTL_S = 30 * 86_400
CHALLENGE_TIMEOUT_S = 10.0
CHALLENGE_MAX_BYTES = 1024
DISPATCH_CACHE_S = 1.0
#: The purpose label of the deployment key behind the challenge response.
RESPONSE_KEY_LABEL = "target-verification"
#: At most this many addresses of a plain-http target's name are challenged (and pinned).
MAX_PINNED_ADDRESSES = 8
#: The head of the refusal of a target whose verification lapsed (``not sent: <LAPSED>: ...``).
LAPSED = "target verification lapsed"


def expected_response(key: bytes, token: str, target_id: str) -> str:
    """The challenge response for ``token`` of target ``target_id`` under deployment key ``key``
    (pure): ``token + "." + base64url_nopad(HMAC-SHA256(key, token || 0x00 || target_id))``."""
    mac = hmac.new(key, token.encode() + b"\x00" + target_id.encode(), hashlib.sha256).digest()
    return token + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


def verification_response(store: Any, token: str, target_id: str) -> str:
    """The exact body the target's origin must serve at its challenge path (under this deployment's
    key, :data:`RESPONSE_KEY_LABEL`). Raises ``KekError`` when the deployment has no KEK."""
    from .derived import derived_key

    return expected_response(derived_key(store, RESPONSE_KEY_LABEL), token, target_id)


def needs_pin(target_url: str | None) -> bool:
    """Whether a target URL is plain http with a host name (its addresses are pinned at verification).
    Pure, and asked twice per attempt: the answer is cached by URL."""
    if not target_url:
        return False
    return _needs_pin(target_url)


@functools.lru_cache(maxsize=4096)
def _needs_pin(target_url: str) -> bool:
    parts = urlsplit(target_url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    try:
        ipaddress.ip_address(parts.hostname.strip("[]").split("%", 1)[0])
    except ValueError:
        return True
    return False

_log = logging.getLogger("fireledger.dispatch")


def challenge_url(target_url: str, token: str) -> str:
    """The challenge URL on the origin of ``target_url``."""
    parts = urlsplit(target_url)
    return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}{token}"


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    out = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return out[:200]


def _scheme_problem(target_url: str, token: str, policy: EgressPolicy) -> str | None:
    """The egress refusal of the challenge's scheme (an IP-literal host's own refusal first: the
    graver reason), or None."""
    parts = urlsplit(target_url)
    why = policy.scheme_refusal(parts.scheme)
    if why is None:
        return None
    host = (parts.hostname or "").strip("[]")
    try:
        policy.check(host, ipaddress.ip_address(host.split("%", 1)[0]))
    except ValueError as exc:
        if isinstance(exc, EgressRefused):
            return str(exc)
    return f"egress refused: {challenge_url(target_url, token)}: {why}"


class _OneAddress(AbstractResolver):
    """Answers every lookup with one already-vetted address (the challenge of that address)."""

    def __init__(self, address: str, family: int) -> None:
        self.address = address
        self.family = family

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return [{"hostname": host, "host": self.address, "port": port, "family": self.family,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None


async def fetch_challenge(target_url: str, token: str, policy: EgressPolicy, *, expected: str,
                          timeout_s: float = CHALLENGE_TIMEOUT_S,
                          resolver: AbstractResolver | None = None) -> str | None:
    """Fetch the challenge for ``token`` on ``target_url``'s origin: None when it answers exactly
    ``expected`` (:func:`verification_response`), else a one-line cause (never the response body).
    ``resolver`` replaces the system resolver (under the egress guard)."""
    url = challenge_url(target_url, token)
    scheme_problem = _scheme_problem(target_url, token, policy)
    if scheme_problem is not None:
        return scheme_problem
    try:
        async with aiohttp.ClientSession(
            connector=guarded_connector(policy, resolver=resolver, limit=1),
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
    if not hmac.compare_digest(body.strip(), expected.encode("ascii", "replace")):
        return (f"the challenge at {url} does not answer the verification response "
                "(serve verification.response, not the token)")
    return None


async def prove_ownership(target_url: str, token: str, expected: str, policy: EgressPolicy, *,
                          timeout_s: float = CHALLENGE_TIMEOUT_S,
                          resolver: AbstractResolver | None = None) -> tuple[str | None, tuple[str, ...] | None]:
    """Run the challenge for a target: ``(None, addresses)`` when ownership is proved, else
    ``(cause, None)``. ``addresses`` is None except for a plain-http target with a host name
    (:func:`needs_pin`): the name is resolved once through the egress guard and the challenge is
    fetched from each address (at most :data:`MAX_PINNED_ADDRESSES`); those that answered are
    returned (the dispatch pin), and at least one must. ``resolver`` replaces the system resolver."""
    if not needs_pin(target_url):
        cause = await fetch_challenge(target_url, token, policy, expected=expected, timeout_s=timeout_s,
                                      resolver=resolver)
        return cause, None
    parts = urlsplit(target_url)
    host = parts.hostname or ""
    scheme_problem = _scheme_problem(target_url, token, policy)
    if scheme_problem is not None:
        return scheme_problem, None
    guard = GuardedResolver(policy, resolver)
    try:
        async with asyncio.timeout(timeout_s):
            found = await guard.resolve(host, parts.port or 80, family=socket.AF_UNSPEC)
    except EgressRefused as exc:
        return str(exc), None
    except TimeoutError:
        return f"{host} could not be resolved within {timeout_s:g}s", None
    except (OSError, ValueError) as exc:
        return f"{host} could not be resolved ({_short(exc)})", None
    finally:
        await guard.close()
    addresses = list(dict.fromkeys((str(r["host"]), int(r["family"])) for r in found))[:MAX_PINNED_ADDRESSES]
    answered: list[str] = []
    causes: list[str] = []
    for address, family in addresses:
        cause = await fetch_challenge(target_url, token, policy, expected=expected, timeout_s=timeout_s,
                                      resolver=_OneAddress(address, family))
        if cause is None:
            answered.append(str(ipaddress.ip_address(address.split("%", 1)[0])))
        else:
            causes.append(f"{address}: {cause}")
    if not answered:
        return "; ".join(causes)[:600], None
    return None, tuple(sorted(answered))


async def prove_target(store: Any, target_id: str, url: str, token: str, method: str, policy: EgressPolicy, *,
                       resolver: AbstractResolver | None = None,
                       nameservers: tuple[tuple[str, int], ...] = ()) -> tuple[str | None, tuple[str, ...] | None]:
    """Prove ownership of target ``target_id`` (``url``, challenge ``token``) by ``method``: ``http``
    (:func:`prove_ownership`, under ``policy`` and ``resolver``) or ``dns`` (the TXT record of
    :mod:`.dnsverify`, asking ``nameservers`` or the system's). ``(None, addresses)`` when proved
    (addresses: the http pin, else None), else ``(cause, None)``. The one entry point of the
    verify API and of the automatic re-verification."""
    expected = await asyncio.to_thread(verification_response, store, token, target_id)
    if method == "dns":
        from .dnsverify import prove_by_dns  # dnspython is loaded only when the method is used

        return await prove_by_dns(url, expected, nameservers), None
    return await prove_ownership(url, token, expected, policy, resolver=resolver)


def verification_problem(t: Any, now_us: int) -> str | None:
    """Why target ``t`` (a :class:`~fireledger.store.trust.TargetTrust`) may not be used now, or None.
    Only ``http`` targets need verification; a verification without expiry never lapses. A lapsed
    verification (state ``lapsed``, or ``verified`` past its expiry before the job marked it) is
    named by a problem starting with :data:`LAPSED`, which the history shows as a warning."""
    if t.deleted_us is not None:
        return f"target {t.id} was deleted"
    if t.kind != "http":
        return None
    expired = t.expires_us is not None and t.expires_us <= now_us
    if t.state == "lapsed" or (t.state == "verified" and expired):
        when = format_instant(from_us(t.expires_us)) if t.expires_us is not None else "its expiry"
        return (f"{LAPSED}: target {t.id}'s ownership verification lapsed at {when} without being renewed; "
                f"POST /v1/targets/{t.id}/verify to verify it again")
    if t.state != "verified":
        why = f" ({t.error})" if getattr(t, "error", None) else ""
        return (f"target {t.id}'s ownership is not verified (state {t.state}{why}); serve its "
                f"verification.response at {WELL_KNOWN}<token> on its origin, then "
                f"POST /v1/targets/{t.id}/verify")
    if needs_pin(t.url) and not getattr(t, "addresses", None):
        return (f"target {t.id} is plain http and its verification recorded no addresses to pin; "
                f"POST /v1/targets/{t.id}/verify to verify it again")
    return None


def target_write_problem(store: Any, tenant_id: str, target_id: str, now_us: int) -> str | None:
    """The problem with pointing a trigger of ``tenant_id`` at ``target_id`` now, or None. Another
    tenant's target is reported exactly like a missing one."""
    t = store.trust.target_trust(target_id)
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
    t = store.trust.target_trust(target_id)
    with _CACHE_LOCK:
        if len(_CACHE) > 10_000:
            _CACHE.clear()
        _CACHE[(id(store), target_id)] = (t, time.monotonic() + DISPATCH_CACHE_S)
    return t


async def _checked(store: Any, target: Any, now_us: int) -> tuple[str | None, Any]:
    if getattr(target, "kind", "http") != "http":
        return None, None
    found, t = _cached_trust(store, target.id)
    if not found:   # one store read per target however many attempts are waiting for it (0206)
        t = await once(("trust", id(store), target.id), lambda: _load_trust(store, target.id))
    if t is None:
        return f"target {target.id} does not exist", None
    return verification_problem(t, now_us), t


async def dispatch_refusal(store: Any, target: Any, now_us: int) -> str | None:
    """The attempt runner's re-check before an attempt: why ``target`` must not be called now (its
    verification is missing, failed or lapsed, or it was deleted), or None. The store is read off the
    event loop, at most once per target per :data:`DISPATCH_CACHE_S`."""
    return (await _checked(store, target, now_us))[0]


async def admit(store: Any, job: Any, now_us: int) -> tuple[Any, str | None]:
    """The attempt runner's trust gate, called once per attempt before anything is sent:
    ``(job, None)`` with the payload decrypted (the one decryption point, :mod:`.envelope`) and, for a
    plain-http target with a host name, ``pinned_addresses`` set to the addresses it was verified at, or
    ``(job, cause)`` when the attempt must not be made — the target's verification is missing, failed
    or lapsed, the target is gone, or the payload cannot be opened (the tenant's key was destroyed, or
    the key-encryption key does not unwrap it: ``KekError``, never raised from here).
    The runner records such an attempt ``failed`` with the cause; the target is not called."""
    refusal, trust = await _checked(store, job.target, now_us)
    if refusal is not None:
        return job, f"not sent: {refusal}"
    if trust is not None and needs_pin(job.target.url):
        job = evolve(job, pinned_addresses=trust.pinned)   # connect only where ownership was proved
    try:
        return await open_job_payload(store, job), None
    except (PayloadUnreadable, KekError) as exc:
        return job, _unopened(job, exc)


def admit_now(store: Any, job: Any, now_us: int) -> tuple[Any, str | None] | None:
    """:func:`admit` without waiting: its answer when all it needs is cached in this process (the
    target's verification state, the tenant's data key), else None (call :func:`admit`). Runs on
    the event loop: the attempt runner prepares an attempt with it as it is claimed (decision 0242)."""
    target = job.target
    trust = None
    if getattr(target, "kind", "http") == "http":
        found, trust = _cached_trust(store, target.id)
        if not found:
            return None
        if trust is None:
            return job, f"not sent: target {target.id} does not exist"
        refusal = verification_problem(trust, now_us)
        if refusal is not None:
            return job, f"not sent: {refusal}"
    if trust is not None and needs_pin(job.target.url):
        job = evolve(job, pinned_addresses=trust.pinned)
    try:
        opened = open_job_payload_now(store, job)
    except (PayloadUnreadable, KekError) as exc:
        return job, _unopened(job, exc)
    return None if opened is None else (opened, None)


def _unopened(job: Any, exc: PayloadUnreadable | KekError) -> str:
    """The recorded cause of an attempt whose payload cannot be opened."""
    if isinstance(exc, PayloadUnreadable):
        return f"not sent: {exc}"
    # The deployment's key-encryption key cannot unwrap this tenant's key: recorded with a cause
    # (no path or key detail: the tenant reads it), the detail logged for the operator.
    _log.error("tenant %s: the payload key cannot be unwrapped: %s", job.fire.tenant_id, exc)
    return ("not sent: the payload cannot be opened: this deployment's key-encryption key does "
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
    "LAPSED",
    "MAX_PINNED_ADDRESSES",
    "RESPONSE_KEY_LABEL",
    "VERIFICATION_TTL_S",
    "WELL_KNOWN",
    "admit",
    "admit_now",
    "challenge_url",
    "dispatch_refusal",
    "expected_response",
    "fetch_challenge",
    "forget_cached",
    "needs_pin",
    "prove_ownership",
    "prove_target",
    "target_write_problem",
    "verification_problem",
    "verification_response",
]
