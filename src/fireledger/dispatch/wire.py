"""A lean HTTP/1.1 client for the dispatch plane: one POST per exchange over pooled keep-alive
connections (docs/decisions/0075-lean-http-sender.md).

:class:`HttpSender <fireledger.dispatch.http.HttpSender>` owns the contract (outcomes, headers,
timeouts); this module only moves bytes:

* :func:`parse_target` turns a URL into a :class:`Target` once (origin, request-line prefix);
  :func:`request_bytes` assembles status line, headers and body into one ``bytes`` for one
  ``transport.write``.
* :class:`Connection` is an ``asyncio.Protocol`` whose responses are parsed by httptools'
  ``HttpResponseParser`` (llhttp, in C): the head (status, ``Retry-After``, ``Date``) wakes the
  sender, the body is counted and discarded, and a body past the cap closes the connection.
* :class:`Pool` keeps idle keep-alive connections per origin (scheme, host, port), caps the
  connections in use (``limit`` in all, ``limit_per_host`` per origin) with a FIFO of waiters, and
  opens new connections through the egress guard (invariant 12): a host name is resolved by
  :class:`~fireledger.security.egress.GuardedResolver` (refused as a whole when any address is),
  an IP literal is checked by the policy, and each socket is opened by
  :func:`~fireledger.security.egress.guarded_socket_factory` to a vetted address only (happy
  eyeballs over those addresses, as aiohttp does); TLS keeps SNI and certificate verification.

:meth:`Pool.post` raises :class:`ExchangeError` (with ``sent`` and a ``kind``) for everything the
network or the peer does, ``EgressRefused``/``ValueError`` for what cannot be sent, and lets
``CancelledError`` through (the connection in use is closed).
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import select
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import aiohappyeyeballs
import httptools
import yarl
from aiohttp.abc import AbstractResolver

from fireledger.errors import FireledgerError
from fireledger.security.egress import EgressPolicy, EgressRefused, GuardedResolver, guarded_socket_factory

__all__ = [
    "KEEPALIVE_S",
    "AddressNotVerified",
    "Connection",
    "ExchangeError",
    "Pool",
    "Reply",
    "Target",
    "parse_target",
    "request_bytes",
]

#: An idle pooled connection older than this is closed rather than reused (aiohttp's default too).
KEEPALIVE_S = 15.0
#: A host name's vetted addresses are reused for new connections this long (aiohttp's default too).
DNS_TTL_S = 10.0
#: Largest response head (status line and headers, interim heads included) read from a target; a
#: longer one fails the exchange as a protocol error (the parser would otherwise buffer it whole
#: until the attempt's deadline: decision 0092).
RESPONSE_HEAD_MAX_BYTES = 64 * 1024
HAPPY_EYEBALLS_DELAY_S = 0.25
_TARGET_CACHE_MAX = 4096

# RFC 9110 token characters: what a header field name may consist of.
_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

Origin = tuple[str, str, int]   # (scheme, host, port)
ErrorKind = Literal["timeout", "connect", "closed", "protocol"]


class ExchangeError(FireledgerError):
    """The exchange did not produce a response head. ``sent``: the request bytes were handed to an
    open connection. ``kind``: ``timeout`` (the deadline passed), ``connect`` (DNS, TCP or TLS),
    ``closed`` (the peer or the sender closed the connection), ``protocol`` (not HTTP/1.x)."""

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


def parse_target(url: str, user_agent: str) -> Target:
    """Parse ``url`` (http or https, with a host, no credentials); raises ``ValueError``."""
    try:
        u = yarl.URL(url)
        host = u.raw_host
        port = u.port
        path = u.raw_path_qs or "/"
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
                  server_hostname=host.rstrip("."), prefix=prefix)


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

    __slots__ = ("_expired", "_parser", "_pool", "body_left", "closed", "date", "error",
                 "fail_kind", "head_bytes", "idle_since", "interim", "keep_alive", "origin", "over_cap",
                 "peer", "poller", "retry_after", "state", "status", "transport", "waiter")

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self._pool = pool
        self.origin = origin
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer: str | None = None   # the address connected to (checked against pinned addresses)
        self.poller: Any = None
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
        sock = transport.get_extra_info("socket")
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
        self._pool._forget(self)

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


class Pool:
    """Keep-alive connections per origin, ``limit`` in use at once (``limit_per_host`` per origin,
    0 = no per-origin cap). Idle connections count against ``limit`` too: opening a new one when
    ``limit`` are open closes the oldest idle one. Bound to ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, limit: int, limit_per_host: int,
                 policy: EgressPolicy, ssl_context: ssl.SSLContext | None,
                 resolver: AbstractResolver | None = None) -> None:
        self.loop = loop
        self._limit = limit
        self._per_host = limit_per_host
        self._policy = policy
        self._resolver = GuardedResolver(policy, resolver)
        self._socket_factory: Callable[[tuple[Any, ...]], socket.socket] = guarded_socket_factory(policy)
        self._ssl_context = ssl_context
        self._in_use = 0
        self._host_use: dict[Origin, int] = {}
        self._idle: dict[Origin, list[Connection]] = {}
        self._idle_count = 0
        self._all: set[Connection] = set()
        self._waiters: collections.deque[tuple[Origin, asyncio.Future[bool]]] = collections.deque()
        self._dns: dict[tuple[str, int], tuple[float, list[tuple[Any, ...]]]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    # --- slots ----------------------------------------------------------------------------------

    def _can_take(self, origin: Origin) -> bool:
        if self._in_use >= self._limit:
            return False
        return not self._per_host or self._host_use.get(origin, 0) < self._per_host

    def _take(self, origin: Origin) -> None:
        self._in_use += 1
        self._host_use[origin] = self._host_use.get(origin, 0) + 1

    def _give_back(self, origin: Origin) -> None:
        self._in_use -= 1
        left = self._host_use[origin] - 1
        if left:
            self._host_use[origin] = left
        else:
            del self._host_use[origin]
        if self._waiters:
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        ws = self._waiters
        blocked: list[tuple[Origin, asyncio.Future[bool]]] = []
        while ws and self._in_use < self._limit:
            origin, fut = ws.popleft()
            if fut.done():
                continue
            if self._per_host and self._host_use.get(origin, 0) >= self._per_host:
                blocked.append((origin, fut))
                continue
            self._take(origin)   # the slot is handed over: nobody arriving later can take it
            fut.set_result(True)
        ws.extendleft(reversed(blocked))

    async def _wait_slot(self, origin: Origin, deadline: float) -> None:
        fut: asyncio.Future[bool] = self.loop.create_future()
        self._waiters.append((origin, fut))
        timer = self.loop.call_at(deadline, _expire_waiter, fut)
        try:
            granted = await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.result():
                self._give_back(origin)   # granted, then cancelled before it was used
            raise
        finally:
            timer.cancel()
        if not granted:
            raise ExchangeError("timeout", "timed out waiting for a free connection", sent=False)
        if self._closed:
            self._give_back(origin)
            raise ExchangeError("closed", "the sender was closed", sent=False)

    # --- idle connections -----------------------------------------------------------------------

    def _pop_idle(self, origin: Origin, pins: frozenset[str] | None = None) -> Connection | None:
        stack = self._idle.get(origin)
        if not stack:
            return None
        now = self.loop.time()
        for i in range(len(stack) - 1, -1, -1):   # the most recently used first: the least likely stale
            conn = stack[i]
            if pins is not None and conn.peer not in pins and conn.usable(now):
                continue   # open to an address this attempt may not use: left for others
            del stack[i]
            self._idle_count -= 1
            if conn.usable(now):
                return conn
            conn.abort()
        return None

    def _put_idle(self, conn: Connection) -> None:
        conn.state = _IDLE
        conn.waiter = None
        conn.idle_since = self.loop.time()
        self._idle.setdefault(conn.origin, []).append(conn)
        self._idle_count += 1
        if self._sweep is None:
            self._sweep = self.loop.call_later(KEEPALIVE_S, self._sweep_idle)

    def _sweep_idle(self) -> None:
        self._sweep = None
        cutoff = self.loop.time() - KEEPALIVE_S
        for origin, stack in list(self._idle.items()):
            keep = [c for c in stack if c.idle_since > cutoff and not c.closed]
            for c in stack:
                if c not in keep:
                    c.abort()
            self._idle_count -= len(stack) - len(keep)
            if keep:
                self._idle[origin] = keep
            else:
                del self._idle[origin]
        if self._idle_count and not self._closed:
            self._sweep = self.loop.call_later(KEEPALIVE_S, self._sweep_idle)

    def _make_room(self) -> None:
        """Close the oldest idle connection while ``limit`` connections are open."""
        while self._idle_count and self._in_use + self._idle_count > self._limit:
            oldest: Connection | None = None
            for stack in self._idle.values():
                if stack and (oldest is None or stack[0].idle_since < oldest.idle_since):
                    oldest = stack[0]
            if oldest is None:
                return
            self._idle[oldest.origin].pop(0)
            if not self._idle[oldest.origin]:
                del self._idle[oldest.origin]
            self._idle_count -= 1
            oldest.abort()

    def _forget(self, conn: Connection) -> None:
        """``conn`` is closed (called from connection_lost)."""
        self._all.discard(conn)
        if conn.state == _IDLE:
            stack = self._idle.get(conn.origin)
            if stack and conn in stack:
                stack.remove(conn)
                self._idle_count -= 1
                if not stack:
                    del self._idle[conn.origin]

    # --- connecting -----------------------------------------------------------------------------

    async def _addr_infos(self, target: Target, pins: frozenset[str] | None = None) -> list[tuple[Any, ...]]:
        infos = await self._resolved(target)
        if pins is None or target.ip is not None:
            return infos
        kept = [i for i in infos if _norm(str(i[4][0])) in pins]
        if not kept:
            _scheme, host, _port = target.origin
            now_at = ", ".join(sorted({str(i[4][0]) for i in infos}))
            raise AddressNotVerified(
                f"egress refused: {host} now resolves to {now_at}, none of the addresses its ownership was "
                f"verified at ({', '.join(sorted(pins))}); verify the target again")
        return kept

    async def _resolved(self, target: Target) -> list[tuple[Any, ...]]:
        _scheme, host, port = target.origin
        if target.ip is not None:
            self._policy.check(host, target.ip)   # an IP literal is not resolved: vet it here
            family = socket.AF_INET6 if ":" in target.ip else socket.AF_INET
            addr = (target.ip, port, 0, 0) if family == socket.AF_INET6 else (target.ip, port)
            return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", addr)]
        key = (host, port)
        now = self.loop.time()
        hit = self._dns.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            hosts = await self._resolver.resolve(host, port, family=socket.AF_UNSPEC)
        except OSError as exc:
            raise ExchangeError("connect", f"cannot resolve {host}: {_describe(exc)}", sent=False) from None
        infos = []
        for h in hosts:
            fam = h["family"]
            addr = (h["host"], h["port"], 0, 0) if fam == socket.AF_INET6 else (h["host"], h["port"])
            infos.append((fam, socket.SOCK_STREAM, h["proto"] or socket.IPPROTO_TCP, "", addr))
        if len(self._dns) > 1024:
            self._dns.clear()
        self._dns[key] = (now + DNS_TTL_S, infos)
        return infos

    async def _connect(self, target: Target, deadline: float, pins: frozenset[str] | None = None) -> Connection:
        scheme, host, port = target.origin
        try:
            async with asyncio.timeout_at(deadline):
                infos = await self._addr_infos(target, pins)
                self._policy.check_scheme(host, scheme)   # after the address: its reason is the graver
                try:
                    sock = await aiohappyeyeballs.start_connection(
                        infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_S, loop=self.loop,
                        socket_factory=self._socket_factory)
                except (OSError, RuntimeError) as exc:   # uvloop may say RuntimeError
                    raise ExchangeError("connect", f"cannot connect to {host}:{port}: {_describe(exc)}",
                                        sent=False) from None
                conn = Connection(self, target.origin)
                ctx: ssl.SSLContext | None = None
                if target.tls:
                    if self._ssl_context is None:
                        self._ssl_context = ssl.create_default_context()
                    ctx = self._ssl_context
                try:
                    await self.loop.create_connection(
                        lambda: conn, sock=sock, ssl=ctx,
                        server_hostname=target.server_hostname if ctx is not None else None)
                except (OSError, RuntimeError) as exc:   # ssl.SSLError is an OSError
                    raise ExchangeError("connect", f"cannot connect to {host}:{port}: {_describe(exc)}",
                                        sent=False) from None
        except TimeoutError:
            raise ExchangeError("timeout", "timed out connecting", sent=False) from None
        self._all.add(conn)
        if self._closed:
            conn.abort()
            raise ExchangeError("closed", "the sender was closed", sent=False)
        return conn

    # --- the exchange ---------------------------------------------------------------------------

    async def post(self, target: Target, data: bytes, deadline: float, body_cap: int,
                   pins: frozenset[str] | None = None) -> Reply:
        """Write ``data`` on a pooled or new connection to ``target`` and wait for the response
        head (until ``deadline``, a ``loop.time()``), then read and discard at most ``body_cap``
        body bytes within what is left. Raises :class:`ExchangeError` when no head arrived.
        ``pins``: the only addresses a host name may be reached at (the ones its ownership was
        verified at); when it resolves to none of them, :class:`AddressNotVerified` is raised and
        nothing is sent. Ignored for an IP-literal host (the URL names the address)."""
        if self._closed:
            raise ExchangeError("closed", "the sender was closed", sent=False)
        origin = target.origin
        if self._can_take(origin):   # a free slot has no eligible waiter (_wake_waiters hands over)
            self._take(origin)
        else:
            await self._wait_slot(origin, deadline)
        conn: Connection | None = None
        try:
            conn = self._pop_idle(origin, pins if target.ip is None else None)
            if conn is None:
                self._make_room()
                conn = await self._connect(target, deadline, pins)
            reply = await self._exchange(conn, data, deadline, body_cap)
        except BaseException:
            if conn is not None:
                conn.abort()
            self._give_back(origin)
            raise
        if conn.state == _DONE and conn.keep_alive and not conn.closed and not self._closed:
            self._put_idle(conn)
        else:
            conn.abort()
        self._give_back(origin)
        return reply

    async def _exchange(self, conn: Connection, data: bytes, deadline: float, body_cap: int) -> Reply:
        transport = conn.transport
        assert transport is not None
        conn.state = _HEAD
        conn.status = 0
        conn.interim = False
        conn.over_cap = False
        conn.keep_alive = False
        conn.body_left = body_cap
        conn.head_bytes = 0
        conn.error = None
        conn._expired = False
        waiter = conn.waiter = self.loop.create_future()
        transport.write(data)   # the request is handed to the connection: the target may see it
        timer = self.loop.call_at(deadline, conn.expire)
        try:
            if conn.state == _HEAD and not conn.closed:
                await waiter
            if conn.state == _HEAD:
                if conn.closed:   # closed without a word before the write was noticed
                    raise ExchangeError("closed", "the connection was closed before the response", sent=True)
                raise ExchangeError("timeout", "no response head before the deadline", sent=True)
            if conn.state == _FAILED:
                raise ExchangeError(conn.fail_kind, conn.error or "failed", sent=True)
            reply = Reply(conn.status,
                          conn.retry_after.decode("latin-1") if conn.retry_after is not None else None,
                          conn.date.decode("latin-1") if conn.date is not None else None)
            if conn.state == _BODY and not conn._expired:
                waiter = conn.waiter = self.loop.create_future()
                await waiter
            return reply   # a body that did not end in time leaves the state _BODY: post closes it
        finally:
            timer.cancel()

    async def close(self) -> None:
        """Close every connection (idle and in use) and release the waiters. Idempotent."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
        self._idle_count = 0
        while self._waiters:
            _origin, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(True)   # woken to find the pool closed (see _wait_slot)
                self._take(_origin)
        await self._resolver.close()
        await asyncio.sleep(0)   # let the transports run connection_lost


def _expire_waiter(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)
