"""Async HTTP sender for the dispatch plane: one signed POST per attempt, classified outcome.

Contract of :meth:`HttpSender.send`:

* Exactly one ``POST`` to ``req.url`` with the body bytes as given, headers ``content-type:
  application/json``, ``fireledger-fire-key``, ``webhook-id`` (= ``req.msg_id``),
  ``webhook-timestamp`` (= ``req.timestamp``), ``webhook-signature`` (Standard Webhooks v1 with
  ``req.secret``) and ``req.extra_headers``, plus ``host``, ``user-agent`` and ``content-length``
  (HTTP/1.1, no compression asked for). No redirect is followed, no cookie is stored or sent, no
  proxy is used. Every connection obeys the egress guard (invariant 12,
  :mod:`fireledger.security.egress`); a refused address or scheme (plain http where private targets
  are not allowed) is a final ``failed`` whose error says ``egress refused`` and why, and nothing is
  sent. With ``req.pinned_addresses`` the host name is reached only at those addresses (the ones its
  ownership was verified at); a name that now resolves to none of them is a final ``failed``
  (``egress refused: … verify the target again``), nothing sent.
* It never raises for anything the network or the target does; the result says what happened:

  ============  ==============================================================================
  delivered     a 2xx response
  retry         408, 429 or 5xx; a connection/DNS/TLS error; a connection not established
                within ``connect_timeout_s``; the timeout expired before the request was written
                (e.g. connecting or waiting for a pooled connection); or a request the receiver
                never got: written, but the kernel shows its TCP acknowledged none of it
                within ``connect_timeout_s`` (abandoned then) or by the timeout (``sent=False``)
  failed        any other status (3xx, other 4xx, ...), or a request that cannot be made (bad URL)
  unknown       the request was written, no response arrived before the timeout, and there is
                no evidence that it did not reach the target: the target may have accepted it
  ============  ==============================================================================

  The evidence is the kernel's (Linux ``TCP_INFO``, ``tcpi_bytes_acked``): a receiver whose accept
  queue is full completes the TCP handshake on the client's side only and drops the request's
  segments unacknowledged, so nothing reached it. Where the platform gives no such figure, a
  written request without a response stays ``unknown`` (docs/decisions/0115-unacknowledged-
  request-is-not-sent.md).

* ``timeout_s`` bounds the whole exchange, from the call to the response status line and
  headers. The response body is then read (at most :data:`BODY_CAP_BYTES`, within what is left
  of the timeout) and discarded; once the status is known, a slow or broken body does not change
  the outcome. A connection whose body was not read to its end (past the cap, out of time,
  ``Connection: close``, HTTP/1.0 without keep-alive) is closed, not pooled.
* ``error`` is a short description that never contains the request or response body.
* ``sent`` reports whether the request headers were written to a connection and not shown by
  the kernel to have gone unacknowledged, i.e. whether the target may have seen the attempt.
  Connection errors after the write are classified ``retry`` (as the dispatch plane's policy
  says) but keep ``sent=True``. A request is never resent within
  one call (a pooled connection the peer closed is detected before use; one that fails after the
  write is a ``retry``): the dispatch plane's retry is the resend, under the same key.
* Cancellation (``asyncio.CancelledError``) propagates; the connection in use is closed.
"""

from __future__ import annotations

import asyncio
import email.utils
import ipaddress
import math
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import yarl
from aiohttp.abc import AbstractResolver

from fireledger.dispatch import signing
from fireledger.dispatch.pool import CONNECT_TIMEOUT_S, ConnectStats, Flow, Pool
from fireledger.dispatch.retry import RETRY_AFTER_MAX_S
from fireledger.dispatch.wire import ExchangeError, Target, parse_target, request_bytes
from fireledger.security.egress import EgressPolicy

__all__ = [
    "BODY_CAP_BYTES",
    "RESERVED_HEADERS",
    "HttpRequest",
    "HttpResult",
    "HttpSender",
    "Outcome",
    "classify_status",
    "parse_retry_after",
]

Outcome = Literal["delivered", "retry", "failed", "unknown"]

BODY_CAP_BYTES = 64 * 1024
FIRE_KEY_HEADER = "fireledger-fire-key"
RESERVED_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "transfer-encoding",
        "host",
        FIRE_KEY_HEADER,
        signing.HEADER_ID,
        signing.HEADER_TIMESTAMP,
        signing.HEADER_SIGNATURE,
    }
)
_ERROR_MAX = 200
_TARGET_CACHE_MAX = 4096


#: A control character other than horizontal tab (C0 and DEL): never allowed in a header value.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f]")


def _header_safe(name: str, value: str) -> None:
    """``value`` may be sent as a header value: a string with no control character but tab (one
    regex scan in C: this runs for every header of every attempt, the token's included)."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    if _CONTROL.search(value) is not None:
        raise ValueError(f"{name} must not contain control characters")


#: URLs that passed :func:`_check_url` (the same few targets are sent to over and over: decision 0234).
_URLS_OK: set[str] = set()


def _check_url(url: str) -> None:
    """``url`` is an absolute http(s) URL with a host (``ValueError`` otherwise); remembered when it is."""
    try:
        u = yarl.URL(url)
    except (TypeError, ValueError):
        raise ValueError("url is not a valid URL") from None
    if u.scheme not in ("http", "https") or not u.host:
        raise ValueError("url must be an absolute http(s) URL with a host")
    if len(_URLS_OK) >= _TARGET_CACHE_MAX:
        _URLS_OK.clear()
    _URLS_OK.add(url)


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One attempt to deliver. ``secret``, ``body`` and ``extra_headers`` are kept out of repr.

    Construction validates: http(s) URL with a host, ``timeout_s`` finite and > 0, ``body`` bytes,
    ``timestamp`` a non-negative int, header-safe ``fire_key``/``msg_id``, a well-formed secret, and
    ``extra_headers`` not overriding a reserved header (``RESERVED_HEADERS``). Violations raise
    ``ValueError``.
    """

    url: str
    secret: str = field(repr=False)
    fire_key: str
    msg_id: str
    timestamp: int
    body: bytes = field(repr=False)
    timeout_s: float
    extra_headers: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False)
    pinned_addresses: frozenset[str] | None = None
    #: Whose request this is: connection slots and adaptive limits are kept per (tenant, origin,
    #: path), so one tenant's endpoint never holds another's slots (decision 0133).
    tenant_id: str = ""

    def __post_init__(self) -> None:
        if type(self.url) is not str or self.url not in _URLS_OK:
            _check_url(self.url)
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int | float):
            raise ValueError("timeout_s must be a number")
        if not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise ValueError("timeout_s must be finite and > 0")
        if not isinstance(self.body, bytes):
            raise ValueError("body must be bytes")
        if isinstance(self.timestamp, bool) or not isinstance(self.timestamp, int) or self.timestamp < 0:
            raise ValueError("timestamp must be a non-negative int")
        if not self.fire_key:
            raise ValueError("fire_key must be non-empty")
        _header_safe("fire_key", self.fire_key)
        _header_safe("msg_id", self.msg_id)
        signing.secret_key(self.secret)  # raises ValueError without echoing the secret
        for name, value in self.extra_headers.items():
            if not isinstance(name, str) or not name or not name.isascii() or not name.isprintable():
                raise ValueError("extra header names must be non-empty printable ASCII")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"extra header {name!r} is reserved")
            _header_safe(f"extra header {name!r}", value)
        object.__setattr__(self, "extra_headers", MappingProxyType(dict(self.extra_headers)))
        if self.pinned_addresses is not None:
            try:
                pins = frozenset(str(ipaddress.ip_address(a)) for a in self.pinned_addresses)
            except (TypeError, ValueError):
                raise ValueError("pinned_addresses must be IP addresses") from None
            object.__setattr__(self, "pinned_addresses", pins)

    def headers(self) -> dict[str, str]:
        """The full header set sent for this request (signature computed here, no clock read)."""
        out = {
            "content-type": "application/json",
            FIRE_KEY_HEADER: self.fire_key,
            **signing.build_headers(self.secret, self.msg_id, self.timestamp, self.body),
        }
        out.update(self.extra_headers)
        return out


@dataclass(frozen=True, slots=True)
class HttpResult:
    """What one attempt came to. See the module docstring for the meaning of ``outcome``."""

    outcome: Outcome
    http_status: int | None
    error: str | None
    duration_s: float
    retry_after_s: float | None = None
    sent: bool = False


def classify_status(status: int) -> Outcome:
    """Outcome of a received status: 2xx delivered; 408, 429, 5xx retry; everything else failed."""
    if 200 <= status <= 299:
        return "delivered"
    if status in (408, 429) or 500 <= status <= 599:
        return "retry"
    return "failed"


def parse_retry_after(value: str | None, *, date_header: str | None = None, now: float | None = None) -> float | None:
    """Parse a ``Retry-After`` value into seconds in ``[0, RETRY_AFTER_MAX_S]``, or ``None`` when
    absent/unparseable.

    Delta-seconds (``"3"``; a decimal like ``"1.5"`` is tolerated) are returned as is. An HTTP-date
    is taken relative to the response's ``Date`` header when given (so no local clock is needed and
    the two clocks cannot disagree), else relative to ``now`` (epoch seconds), else ``None``. Either
    form asking for more than :data:`~fireledger.dispatch.retry.RETRY_AFTER_MAX_S` gives that
    maximum: a target cannot postpone its retries past what the store can hold (decision 0082).
    Negative, NaN or infinite values are ignored (``None``).
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return min(seconds, RETRY_AFTER_MAX_S) if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    ref: float | None = None
    if date_header:
        try:
            ref = email.utils.parsedate_to_datetime(date_header.strip()).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            ref = None
    if ref is None:
        ref = now
    if ref is None or not math.isfinite(when - ref):
        return None
    return min(max(0.0, when - ref), RETRY_AFTER_MAX_S)


def _clip(text: str) -> str:
    return text if len(text) <= _ERROR_MAX else text[: _ERROR_MAX - 3] + "..."


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return _clip(f"{name}: {text}" if text else name)


class HttpSender:
    """Sends :class:`HttpRequest` s over pooled HTTP/1.1 keep-alive connections
    (:mod:`fireledger.dispatch.wire`: an asyncio protocol per connection, responses parsed by
    httptools; connections kept by :class:`~fireledger.dispatch.pool.Pool`).

    The pool is created lazily on the first :meth:`send`, inside the running loop, and is bound to
    that loop: using the sender from another loop raises ``RuntimeError``. ``limit`` caps the
    number of simultaneous connections; per flow — ``req.tenant_id``, the URL's origin and path — an
    adaptive limit (:mod:`fireledger.dispatch.limiter`) starts at a few connections, grows while the
    receiver keeps up and halves when it does not (a stalled or refused connect, an unacknowledged
    request, a timeout, 429/503), never above ``limit_per_host`` (0 = ``limit``); further requests
    wait for a free connection in arrival order (per flow), and that wait counts against their
    timeout: one that waited until it ran out is ``retry``, not sent, its error naming the limit.
    ``connect_timeout_s`` bounds establishing a connection and the receiver's TCP acknowledging a
    request, within the request's timeout. New connections to one address are opened one at a time
    (the next when the one before is established or failed; a request waiting its turn takes an idle
    connection handed back meanwhile, and its wait counts against its connect timeout), so a burst
    never sends a burst of SYNs into a small accept queue (decision 0241). Idle keep-alive
    connections count against ``limit`` too (the oldest is closed to make room) and are closed
    after 15 s idle (``wire.KEEPALIVE_S``).
    Every connection obeys the egress policy ``egress`` (the process passes the one its settings
    describe; None: read from the environment when the pool is created, :meth:`EgressPolicy.from_env`).
    ``ssl_context`` replaces the default ``ssl.create_default_context()`` (certificate and host name
    verified, SNI sent); ``resolver`` replaces the system resolver under the egress guard (tests: a
    name this host cannot resolve). Call :meth:`close` (or use ``async with``) when done; a closed
    sender refuses to send.
    """

    def __init__(
        self,
        *,
        limit: int = 256,
        limit_per_host: int = 0,
        user_agent: str = "fireledger",
        trust_env: bool = False,
        body_cap_bytes: int = BODY_CAP_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        resolver: AbstractResolver | None = None,
        egress: EgressPolicy | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        if limit_per_host < 0:
            raise ValueError("limit_per_host must be >= 0")
        if body_cap_bytes < 0:
            raise ValueError("body_cap_bytes must be >= 0")
        if not (isinstance(connect_timeout_s, int | float) and math.isfinite(connect_timeout_s)
                and connect_timeout_s > 0):
            raise ValueError("connect_timeout_s must be finite and > 0")
        if trust_env:
            # A proxy would be the address the guard vets, not the target (invariant 12).
            raise ValueError("trust_env is not supported: dispatch never goes through a proxy")
        _header_safe("user_agent", user_agent)
        self._limit = limit
        self._limit_per_host = limit_per_host
        self._user_agent = user_agent
        self._body_cap = body_cap_bytes
        self._ssl_context = ssl_context
        self._resolver = resolver
        self._egress = egress
        self._connect_timeout_s = float(connect_timeout_s)
        self._pool: Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._targets: dict[str, Target] = {}

    async def __aenter__(self) -> HttpSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _get_pool(self) -> Pool:
        if self._closed:
            raise RuntimeError("HttpSender is closed")
        loop = asyncio.get_running_loop()
        if self._pool is None:
            # Egress guard (invariant 12): no loopback/private/metadata address unless the operator
            # allows it; each connection goes to the addresses its one resolution returned.
            self._pool = Pool(loop, limit=self._limit, limit_per_host=self._limit_per_host,
                              policy=self._egress if self._egress is not None else EgressPolicy.from_env(),
                              ssl_context=self._ssl_context,
                              resolver=self._resolver, connect_timeout_s=self._connect_timeout_s)
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("HttpSender is bound to another event loop")
        return self._pool

    def _target(self, url: str) -> Target:
        t = self._targets.get(url)
        if t is None:
            t = parse_target(url, self._user_agent)
            if len(self._targets) >= _TARGET_CACHE_MAX:
                self._targets.clear()
            self._targets[url] = t
        return t

    def origin_limit(self, url: str, tenant_id: str = "") -> float | None:
        """The adaptive connection limit of ``tenant_id``'s flow to ``url`` (its origin and path)
        now (``None``: never sent to)."""
        if self._pool is None:
            return None
        target = self._target(url)
        lim = self._pool._limits.get((tenant_id, target.origin, target.path))
        return None if lim is None else lim.limit

    def flow(self, url: str, tenant_id: str = "") -> Flow:
        """The flow a request of ``tenant_id`` to ``url`` belongs to (tenant, origin, path): the unit
        of connection slots and adaptive limits. Raises ``ValueError`` for a URL that cannot be sent to."""
        target = self._target(url)
        return (tenant_id, target.origin, target.path)

    def flow_allowed(self, flow: Flow) -> int:
        """How many requests of ``flow`` its adaptive limit lets be in flight now (the pool's
        :meth:`~fireledger.dispatch.pool.Pool.flow_limit`). Raises ``RuntimeError`` when closed."""
        return self._get_pool().flow_limit(flow).allowed

    def held_result(self, flow: Flow, timeout_s: float, since: float) -> HttpResult:
        """What :meth:`send` returns for a request of ``flow`` that waited from ``since`` (a
        ``loop.time()``) until its timeout for a connection of its flow and was not sent: the
        outcome and error a wait in the pool ends with (``retry``, naming the flow's limit)."""
        pool = self._get_pool()
        why = pool._no_slot(flow, False)
        error = _clip(f"timed out before the request was sent ({timeout_s:g}s): {why}")
        return HttpResult("retry", None, error, pool.loop.time() - since)

    def connect_stats(self) -> ConnectStats:
        """New connections now: connects in flight, requests waiting for the connect in flight to
        their address (one at a time, decision 0241), and the most ever in flight to one address at
        once (all 0 before the first send)."""
        if self._pool is None:
            return ConnectStats(0, 0, 0)
        return self._pool.connect_stats()

    async def close(self) -> None:
        """Close the pooled connections. Idempotent."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def send(self, req: HttpRequest, *, since: float | None = None) -> HttpResult:
        """POST ``req`` once and classify the result (see the module docstring). Never raises for
        network or target behaviour; raises ``RuntimeError`` if the sender is closed.

        ``since``: the ``loop.time()`` at which the caller began holding the request back for a
        connection of its flow (its own first-come-first-served queue, decision 0242). The timeout
        then counts from ``since``, and the request is treated as one that waited in the pool: a
        timeout before it was sent is the wait's, not a drop of the receiver."""
        pool = self._get_pool()
        start = time.perf_counter()
        deadline = (pool.loop.time() if since is None else since) + req.timeout_s
        try:
            target = self._target(req.url)
            data = request_bytes(target, req.headers(), req.body)
        except ValueError as exc:   # a request that cannot be made (cannot succeed on retry)
            return HttpResult("failed", None, _short(exc), time.perf_counter() - start)
        try:
            reply = await pool.post(target, data, deadline, self._body_cap, req.pinned_addresses, req.tenant_id,
                                    since)
        except ExchangeError as exc:
            if exc.kind == "timeout":
                if exc.sent:
                    error = f"no response within {req.timeout_s:g}s"
                    return HttpResult("unknown", None, error, time.perf_counter() - start, sent=True)
                error = _clip(f"timed out before the request was sent ({req.timeout_s:g}s): {exc}")
                return HttpResult("retry", None, error, time.perf_counter() - start)
            if exc.kind == "unacked":   # written, but the kernel shows it never reached the receiver
                return HttpResult("retry", None, _clip(f"not delivered: {exc}"), time.perf_counter() - start)
            return HttpResult("retry", None, _clip(str(exc)), time.perf_counter() - start, sent=exc.sent)
        except ValueError as exc:   # EgressRefused: final, names the host and why
            return HttpResult("failed", None, _short(exc), time.perf_counter() - start)
        status = reply.status
        outcome = classify_status(status)
        retry_after = None
        if status == 429 or status == 503:
            retry_after = parse_retry_after(reply.retry_after, date_header=reply.date)
        return HttpResult(
            outcome=outcome,
            http_status=status,
            error=None if outcome == "delivered" else f"HTTP {status}",
            duration_s=time.perf_counter() - start,
            retry_after_s=retry_after,
            sent=True,
        )
