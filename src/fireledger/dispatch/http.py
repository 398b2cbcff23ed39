"""Async HTTP sender for the dispatch plane: one signed POST per attempt, classified outcome.

Contract of :meth:`HttpSender.send`:

* Exactly one ``POST`` to ``req.url`` with the body bytes as given, headers ``content-type:
  application/json``, ``fireledger-fire-key``, ``webhook-id`` (= ``req.msg_id``),
  ``webhook-timestamp`` (= ``req.timestamp``), ``webhook-signature`` (Standard Webhooks v1 with
  ``req.secret``) and ``req.extra_headers``. No redirect is followed, no cookie is stored or sent,
  no proxy from the environment is used unless asked for.
* It never raises for anything the network or the target does; the result says what happened:

  ============  ==============================================================================
  delivered     a 2xx response
  retry         408, 429 or 5xx; a connection/DNS/TLS error; or the timeout expired before the
                request was written (e.g. connecting or waiting for a pooled connection)
  failed        any other status (3xx, other 4xx, ...), or a request that cannot be made (bad URL)
  unknown       the request was written but no response arrived before the timeout: the target
                may have accepted it
  ============  ==============================================================================

* ``timeout_s`` bounds the whole exchange, from the call to the response status line and
  headers. The response body is then read (at most :data:`BODY_CAP_BYTES`, within what is left
  of the timeout) and discarded; once the status is known, a slow or broken body does not change
  the outcome.
* ``error`` is a short description that never contains the request or response body.
* ``sent`` reports whether the request headers were written to a connection, i.e. whether the
  target may have seen the attempt. Connection errors after the write are classified ``retry``
  (as the dispatch plane's policy says) but keep ``sent=True``.
* Cancellation (``asyncio.CancelledError``) propagates.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, SimpleNamespace
from typing import Any, Literal

import aiohttp
import yarl

from fireledger.dispatch import signing
from fireledger.security.egress import guarded_connector

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


def _header_safe(name: str, value: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
        raise ValueError(f"{name} must not contain control characters")


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

    def __post_init__(self) -> None:
        try:
            u = yarl.URL(self.url)
        except (TypeError, ValueError):
            raise ValueError("url is not a valid URL") from None
        if u.scheme not in ("http", "https") or not u.host:
            raise ValueError("url must be an absolute http(s) URL with a host")
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
    """Parse a ``Retry-After`` value into seconds (``>= 0``), or ``None`` when absent/unparseable.

    Delta-seconds (``"3"``; a decimal like ``"1.5"`` is tolerated) are returned as is. An HTTP-date
    is taken relative to the response's ``Date`` header when given (so no local clock is needed and
    the two clocks cannot disagree), else relative to ``now`` (epoch seconds), else ``None``.
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
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
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
    if ref is None:
        return None
    return max(0.0, when - ref)


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    out = f"{name}: {text}" if text else name
    return out if len(out) <= _ERROR_MAX else out[: _ERROR_MAX - 3] + "..."


async def _on_headers_sent(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: Any) -> None:
    state = ctx.trace_request_ctx
    if isinstance(state, dict):
        state["sent"] = True


class HttpSender:
    """Sends :class:`HttpRequest` s over one pooled ``aiohttp.ClientSession``.

    The session is created lazily on the first :meth:`send`, inside the running loop, and is bound
    to that loop: using the sender from another loop raises ``RuntimeError``. ``limit`` caps the
    number of simultaneous connections (``limit_per_host`` per host, 0 = no per-host cap); further
    requests wait for a free connection, and that wait counts against their timeout. Call
    :meth:`close` (or use ``async with``) when done; a closed sender refuses to send.
    """

    def __init__(
        self,
        *,
        limit: int = 256,
        limit_per_host: int = 0,
        user_agent: str = "fireledger",
        trust_env: bool = False,
        body_cap_bytes: int = BODY_CAP_BYTES,
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        if limit_per_host < 0:
            raise ValueError("limit_per_host must be >= 0")
        if body_cap_bytes < 0:
            raise ValueError("body_cap_bytes must be >= 0")
        self._limit = limit
        self._limit_per_host = limit_per_host
        self._user_agent = user_agent
        self._trust_env = trust_env
        self._body_cap = body_cap_bytes
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def __aenter__(self) -> HttpSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("HttpSender is closed")
        loop = asyncio.get_running_loop()
        if self._session is None:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_on_headers_sent)
            # Egress guard (invariant 12): no loopback/private/metadata address unless the operator
            # allows it; each connection goes to the addresses its one resolution returned.
            connector = guarded_connector(limit=self._limit, limit_per_host=self._limit_per_host)
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),  # never carry cookies between targets/tenants
                auto_decompress=False,  # the body is discarded; do not spend CPU inflating it
                trust_env=self._trust_env,
                timeout=aiohttp.ClientTimeout(total=None),  # the per-send deadline is ours
                headers={"user-agent": self._user_agent},
                trace_configs=[trace],
                raise_for_status=False,
            )
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("HttpSender is bound to another event loop")
        return self._session

    async def close(self) -> None:
        """Close the pooled connections. Idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def send(self, req: HttpRequest) -> HttpResult:
        """POST ``req`` once and classify the result (see the module docstring). Never raises for
        network or target behaviour; raises ``RuntimeError`` if the sender is closed."""
        session = self._get_session()
        headers = req.headers()
        state: dict[str, bool] = {"sent": False}
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.timeout_s

        def done(
            outcome: Outcome, status: int | None, error: str | None, retry_after: float | None = None
        ) -> HttpResult:
            return HttpResult(
                outcome=outcome,
                http_status=status,
                error=error,
                duration_s=time.perf_counter() - start,
                retry_after_s=retry_after,
                sent=state["sent"],
            )

        try:
            async with asyncio.timeout_at(deadline):
                resp = await session.post(
                    req.url,
                    data=req.body,
                    headers=headers,
                    allow_redirects=False,
                    trace_request_ctx=state,
                )
        except TimeoutError:
            if state["sent"]:
                return done("unknown", None, f"no response within {req.timeout_s:g}s")
            return done("retry", None, f"timed out before the request was sent ({req.timeout_s:g}s)")
        except aiohttp.InvalidURL as exc:
            return done("failed", None, _short(exc))
        except aiohttp.ClientError as exc:
            return done("retry", None, _short(exc))
        except (OSError, ValueError) as exc:
            # OSError: socket-level failures aiohttp did not wrap. ValueError: a request aiohttp
            # refuses to build (cannot succeed on retry).
            if isinstance(exc, OSError):
                return done("retry", None, _short(exc))
            return done("failed", None, _short(exc))

        async with resp:
            status = resp.status
            outcome = classify_status(status)
            retry_after = None
            if status in (429, 503):
                retry_after = parse_retry_after(
                    resp.headers.get("Retry-After"), date_header=resp.headers.get("Date")
                )
            error = None if outcome == "delivered" else f"HTTP {status}"
            # Read (and discard) at most the cap, within what is left of the deadline. Past the
            # cap the connection is closed rather than returned to the pool.
            try:
                async with asyncio.timeout_at(deadline):
                    remaining = self._body_cap
                    while remaining > 0:
                        chunk = await resp.content.read(min(remaining, 16384))
                        if not chunk:
                            break
                        remaining -= len(chunk)
            except TimeoutError:
                pass
            except (aiohttp.ClientError, OSError):
                pass
            if not resp.content.at_eof():
                resp.close()
            return done(outcome, status, error, retry_after)
