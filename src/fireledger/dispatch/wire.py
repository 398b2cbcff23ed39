"""A lean HTTP/1.1 client for the dispatch plane, the bytes part: one POST per exchange over a
keep-alive connection (docs/decisions/0075-lean-http-sender.md).

:class:`HttpSender <fireledger.dispatch.http.HttpSender>` owns the contract (outcomes, headers,
timeouts); :class:`~fireledger.dispatch.pool.Pool` keeps the connections; this module only moves
bytes:

* :func:`parse_target` turns a URL into a :class:`Target` once (origin, request-line prefix);
  :func:`request_bytes` assembles status line, headers and body into one ``bytes`` for one
  ``transport.write``.
* :class:`Connection` is an ``asyncio.Protocol`` whose responses are parsed by httptools'
  ``HttpResponseParser`` (llhttp, in C): the head (status, ``Retry-After``, ``Date``) wakes the
  sender, the body is counted and discarded, and a body past the cap closes the connection.
* :func:`tcp_acked` reads, where the kernel tells (Linux ``TCP_INFO``), how many bytes the peer's
  TCP has acknowledged on a connection: the evidence that a request reached the receiver's host
  at all (docs/decisions/0115-unacknowledged-request-is-not-sent.md).
"""

from __future__ import annotations

import asyncio
import ipaddress
import select
import socket
import struct
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import httptools
import yarl

from fireledger.errors import FireledgerError
from fireledger.security.egress import EgressRefused

from .timers import Timers

__all__ = [
    "KEEPALIVE_S",
    "AddressNotVerified",
    "Connection",
    "ExchangeError",
    "Reply",
    "Target",
    "parse_target",
    "request_bytes",
    "tcp_acked",
]

#: An idle pooled connection older than this is closed rather than reused (aiohttp's default too).
KEEPALIVE_S = 15.0
#: The least time after the write before "the peer's TCP acknowledged none of it" is evidence: a
#: receiver's kernel may delay its ACK (Linux: up to 200 ms) and a first segment may need one
#: retransmission; a request written later than this before its deadline keeps the rule for a
#: written request (decision 0133: errors only towards caution).
ACK_GRACE_S = 0.5
#: Largest response head (status line and headers, interim heads included) read from a target; a
#: longer one fails the exchange as a protocol error (the parser would otherwise buffer it whole
#: until the attempt's deadline: decision 0092).
RESPONSE_HEAD_MAX_BYTES = 64 * 1024

# struct tcp_info (linux/tcp.h): tcpi_state is byte 0, tcpi_bytes_acked a u64 at offset 120 (kernels
# >= 4.1); a shorter answer gives no evidence.
_TCP_INFO_LEN = 232
_TCPI_BYTES_ACKED = 120
_TCP_INFO = getattr(socket, "TCP_INFO", None) if sys.platform.startswith("linux") else None

# RFC 9110 token characters: what a header field name may consist of.
_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

Origin = tuple[str, str, int]   # (scheme, host, port)
ErrorKind = Literal["timeout", "connect", "unacked", "dns", "closed", "protocol"]


class ExchangeError(FireledgerError):
    """The exchange did not produce a response head. ``sent``: the request may have reached the
    receiver (its bytes were handed to an open connection, and the kernel did not show that none
    of them was acknowledged). ``kind``: ``timeout`` (the deadline passed), ``connect`` (TCP or
    TLS: refused, reset, or not established within the connect timeout), ``unacked`` (written, but
    the receiver's TCP acknowledged none of it within the connect timeout: never accepted; always
    ``sent=False``), ``dns`` (the name did not resolve), ``closed`` (the peer or the sender closed
    the connection), ``protocol`` (not HTTP/1.x)."""

    def __init__(self, kind: ErrorKind, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.kind = kind
        self.sent = sent


class AddressNotVerified(EgressRefused):
    """A pinned host name now resolves only to addresses its ownership was not verified at."""


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed URL: where to connect and the first bytes of every request to it."""

    origin: Origin
    tls: bool
    ip: str | None             # the host as an IP literal, when it is one (no resolution then)
    server_hostname: str       # SNI and certificate name
    prefix: bytes              # "POST <path> HTTP/1.1\r\nhost: ...\r\nuser-agent: ...\r\n"
    path: str = "/"            # the path without the query: the endpoint, for the connection limits


def parse_target(url: str, user_agent: str) -> Target:
    """Parse ``url`` (http or https, with a host, no credentials); raises ``ValueError``."""
    try:
        u = yarl.URL(url)
        host = u.raw_host
        port = u.port
        path = u.raw_path_qs or "/"
        endpoint = u.raw_path or "/"
        host_header = u.host_port_subcomponent
    except (TypeError, ValueError) as exc:
        raise ValueError(f"url is not a valid URL: {exc}") from None
    if u.scheme not in ("http", "https") or not host or port is None or not host_header:
        raise ValueError("url must be an absolute http(s) URL with a host")
    if u.user is not None or u.password is not None:
        raise ValueError("url must not carry credentials (user:password@)")
    try:
        ip: str | None = str(ipaddress.ip_address(host))
    except ValueError:
        ip = None
    if any(c in "\r\n\t " for c in path + host_header):
        raise ValueError("url must not contain whitespace or line breaks")
    prefix = f"POST {path} HTTP/1.1\r\nhost: {host_header}\r\nuser-agent: {user_agent}\r\n".encode()
    return Target(origin=(u.scheme, host, port), tls=u.scheme == "https", ip=ip,
                  server_hostname=host.rstrip("."), prefix=prefix, path=endpoint)


_VETTED_NAMES: set[str] = set()


def request_bytes(target: Target, headers: Mapping[str, str], body: bytes) -> bytes:
    """The whole request: ``target.prefix``, ``headers``, ``content-length`` and ``body``.
    Header names must be RFC 9110 tokens (``ValueError`` otherwise); values are sent as UTF-8
    (the caller has refused control characters)."""
    parts = []
    for name, value in headers.items():
        if name not in _VETTED_NAMES:
            if not name or not set(name) <= _TCHAR:
                raise ValueError(f"header name {name!r} is not a valid token")
            if len(_VETTED_NAMES) < 1024:
                _VETTED_NAMES.add(name)
        parts.append(f"{name}: {value}\r\n")
    parts.append(f"content-length: {len(body)}\r\n\r\n")
    return b"".join((target.prefix, "".join(parts).encode(), body))


@dataclass(frozen=True, slots=True)
class Reply:
    """A response head. ``retry_after``/``date`` are the raw header values (latin-1), if any."""

    status: int
    retry_after: str | None
    date: str | None


# Connection states.
_IDLE, _HEAD, _BODY, _DONE, _FAILED = range(5)


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; one request at a time (no pipelining)."""

    __slots__ = ("_expired", "_on_lost", "_parser", "acked_before", "body_left", "closed", "date", "error",
                 "fail_kind", "head_bytes", "idle_since", "interim", "keep_alive", "origin", "over_cap",
                 "peer", "poller", "retry_after", "sock", "state", "status", "transport", "waiter")

    def __init__(self, on_lost: Callable[[Connection], None], origin: Origin) -> None:
        self._on_lost = on_lost   # the pool forgets the connection (called once it is closed)
        self.origin = origin
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer: str | None = None   # the address connected to (checked against pinned addresses)
        self.poller: Any = None
        self.sock: Any = None        # the transport's socket (TCP_INFO is read from it)
        self.acked_before: int | None = None   # tcp_acked() just before the request was written
        self.state = _IDLE
        self.waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.interim = False
        self.keep_alive = False
        self.over_cap = False
        self.body_left = 0
        self.head_bytes = 0   # bytes of the response head still being parsed (see data_received)
        self.retry_after: bytes | None = None
        self.date: bytes | None = None
        self.error: str | None = None
        self.fail_kind: ErrorKind = "closed"
        self.closed = False
        self._expired = False
        self.idle_since = 0.0

    # --- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)   # uvloop's are not subclasses
        peer = transport.get_extra_info("peername")
        self.peer = _norm(str(peer[0])) if peer else None
        sock = self.sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd >= 0:   # a poll set of this one socket: readable while idle = EOF or stray bytes
            self.poller = select.poll()
            self.poller.register(fd, select.POLLIN | select.POLLPRI)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.state == _HEAD:
            self._fail(f"connection lost before the response: {_describe(exc)}" if exc is not None
                       else "the connection was closed before the response")
        elif self.state == _BODY:   # a body delimited by the end of the connection, or cut short
            self.keep_alive = False
            self._finish()
        self._on_lost(self)

    def eof_received(self) -> bool | None:
        return None   # close the transport: connection_lost ends what is in progress

    def data_received(self, data: bytes) -> None:
        if self.state != _HEAD and self.state != _BODY:
            self.abort()   # bytes nobody asked for: this connection is not in a known state
            return
        was_head = self.state == _HEAD
        try:
            self._parser.feed_data(data)
            if was_head and (self.state == _HEAD or self.interim):
                # The whole chunk belonged to a head still being parsed: the parser holds it.
                self.head_bytes += len(data)
                if self.head_bytes > RESPONSE_HEAD_MAX_BYTES and not self.closed:
                    self._fail(f"invalid HTTP response: the response head is larger than "
                               f"{RESPONSE_HEAD_MAX_BYTES} bytes", kind="protocol")
                    self.abort()
        except httptools.HttpParserUpgrade:
            self.keep_alive = False
            if self.state == _BODY:
                self._finish()
            self.abort()
        except httptools.HttpParserError as exc:
            self.keep_alive = False
            if self.state == _HEAD:
                self._fail(f"invalid HTTP response: {str(exc)[:80]}", kind="protocol")
            elif self.state == _BODY:
                self._finish()
            self.abort()

    # --- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.state != _HEAD:   # a second response to one request: keep the first, drop the connection
            self.keep_alive = False
            self.abort()
            return
        self.retry_after = self.date = None

    def on_header(self, name: bytes, value: bytes) -> None:
        n = len(name)
        if n == 11 or n == 4:
            low = name.lower()
            if low == b"retry-after":
                self.retry_after = value
            elif low == b"date":
                self.date = value

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.interim = True   # 100 Continue, 103 Early Hints...: the final response follows
            return
        if self.state != _HEAD:
            return
        self.status = status
        self.keep_alive = self._parser.should_keep_alive()
        self.state = _BODY
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.state != _BODY or self.interim:
            return
        self.body_left -= len(body)
        if self.body_left < 0:   # past the cap: stop reading, the connection is not reusable
            self.over_cap = True
            self.keep_alive = False
            self._finish()
            self.abort()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if self.state == _BODY:
            self._finish()

    # --- used by Pool.post ----------------------------------------------------------------------

    async def exchange(self, loop: asyncio.AbstractEventLoop, data: bytes, deadline: float, body_cap: int,
                       ack_bound_s: float, timers: Timers | None = None) -> Reply:
        """Write ``data`` and wait for the response head until ``deadline`` (a ``loop.time()``),
        then for the end of the body (at most ``body_cap`` bytes) within what is left. Raises
        :class:`ExchangeError` when no head arrived: ``sent=True`` unless the kernel shows that the
        receiver's TCP acknowledged none of the request — checked ``ack_bound_s`` (at least
        :data:`ACK_GRACE_S`) after the write (kind ``unacked``, abandoned then) and at the deadline
        if the write was at least :data:`ACK_GRACE_S` before it — where it is ``sent=False``. The
        deadline and the check are armed on ``timers`` (the pool's, decision 0235), else on ``loop``."""
        transport = self.transport
        assert transport is not None
        if loop.time() >= deadline:   # e.g. connected at the deadline: not written, so not sent
            raise ExchangeError("timeout", "no time left to write the request", sent=False)
        self.state = _HEAD
        self.status = 0
        self.interim = self.over_cap = self.keep_alive = self._expired = False
        self.body_left = body_cap
        self.head_bytes = 0
        self.error = None
        waiter = self.waiter = loop.create_future()
        self.acked_before = tcp_acked(self.sock)
        transport.write(data)   # the request is handed to the connection: the target may see it
        written_at = loop.time()
        arm: Any = timers.call_at if timers is not None else loop.call_at
        timer = arm(deadline, self.expire)
        check = None
        ack_bound_s = max(ack_bound_s, ACK_GRACE_S)
        if self.acked_before is not None and written_at + ack_bound_s < deadline:
            check = arm(written_at + ack_bound_s, self._check_acked, ack_bound_s)
        try:
            if self.state == _HEAD and not self.closed:
                await waiter
            if self.state == _HEAD:
                if self.closed:   # closed without a word before the write was noticed
                    raise ExchangeError("closed", "the connection was closed before the response", sent=True)
                if loop.time() - written_at >= ACK_GRACE_S and self.unacknowledged():
                    raise ExchangeError("unacked", "no response before the deadline, and the receiver's TCP "
                                        "acknowledged none of the request: it never reached the receiver",
                                        sent=False)
                raise ExchangeError("timeout", "no response head before the deadline", sent=True)
            if self.state == _FAILED:
                raise ExchangeError(self.fail_kind, self.error or "failed", sent=self.fail_kind != "unacked")
            reply = Reply(self.status,
                          self.retry_after.decode("latin-1") if self.retry_after is not None else None,
                          self.date.decode("latin-1") if self.date is not None else None)
            if self.state == _BODY and not self._expired:
                waiter = self.waiter = loop.create_future()
                await waiter
            return reply   # a body that did not end in time leaves the state _BODY: the pool closes it
        finally:
            timer.cancel()
            if check is not None:
                check.cancel()

    def _check_acked(self, bound_s: float) -> None:
        if self.state == _HEAD and self.unacknowledged():
            self._fail(f"the receiver's TCP acknowledged none of the request within {bound_s:g}s: the "
                       f"connection was never accepted (its accept queue may be full)", kind="unacked")

    def reusable(self) -> bool:
        """The exchange ended cleanly on a keep-alive connection: it may carry the next request."""
        return self.state == _DONE and self.keep_alive and not self.closed

    def park(self, now: float) -> None:
        """The connection goes back to the pool, idle since ``now``."""
        self.state = _IDLE
        self.waiter = None
        self.idle_since = now

    @property
    def idle(self) -> bool:
        return self.state == _IDLE

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _finish(self) -> None:
        self.state = _DONE
        self._wake()

    def _fail(self, error: str, kind: ErrorKind = "closed") -> None:
        self.state = _FAILED
        self.error = error
        self.fail_kind = kind
        self._wake()

    def expire(self) -> None:
        """The deadline passed (a timer callback)."""
        self._expired = True
        self._wake()

    def unacknowledged(self) -> bool:
        """The kernel shows that no byte of the request in progress reached the receiver's host:
        nothing of the response arrived and the peer's TCP acknowledged no byte written since
        :attr:`acked_before` was read. False when there is no such evidence (not Linux, no
        ``TCP_INFO``, the socket gone): the caller keeps the rule for a written request."""
        if self.acked_before is None or self.state != _HEAD or self.closed:
            return False
        if self.head_bytes or self.interim:
            return False   # the receiver has answered something
        return tcp_acked(self.sock) == self.acked_before

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def usable(self, now: float) -> bool:
        """An idle connection that may carry the next request: open, not idle too long, and no
        byte or EOF waiting on the socket (the peer may have closed it while it sat in the pool)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        if now - self.idle_since > KEEPALIVE_S:
            return False
        if self.poller is not None:
            try:
                if self.poller.poll(0):
                    return False
            except (OSError, ValueError):
                return False
        return True


def tcp_acked(sock: Any) -> int | None:
    """Bytes the peer's TCP has acknowledged on the TCP socket ``sock`` since the connection
    began (the SYN counts as one), from Linux ``TCP_INFO`` (``tcpi_bytes_acked``); ``None`` where
    the platform or the socket gives no such figure."""
    if _TCP_INFO is None or sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_LEN)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if len(raw) < _TCPI_BYTES_ACKED + 8:
        return None
    return int(struct.unpack_from("=Q", raw, _TCPI_BYTES_ACKED)[0])


def _norm(address: str) -> str:
    """An address in its canonical text form (no zone), for comparison with pinned addresses."""
    try:
        return str(ipaddress.ip_address(address.split("%", 1)[0]))
    except ValueError:
        return address


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "closed"
    text = str(exc).strip()
    name = type(exc).__name__
    out = f"{name}: {text}" if text else name
    return out if len(out) <= 160 else out[:157] + "..."
