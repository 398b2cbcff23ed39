"""Opening new connections for the dispatch plane's pool (:class:`~fireledger.dispatch.pool.Pool`):
resolved and vetted through the egress guard, established within a connect timeout of their own,
**one at a time per address set** (docs/decisions/0117-connect-timeout.md,
0241-one-connect-in-flight-per-address.md).

* A host name is resolved by :class:`~fireledger.security.egress.GuardedResolver` (refused as a
  whole when any address is; kept :data:`DNS_TTL_S`), an IP literal is checked by the policy, and
  each socket is opened by :func:`~fireledger.security.egress.guarded_socket_factory` to a vetted
  address only (happy eyeballs over those addresses, as aiohttp does); TLS keeps SNI and
  certificate verification.
* A connection must be established (TCP and TLS) within ``connect_timeout_s`` of the request
  needing it; a stalled connect (a receiver whose accept queue is full drops the SYN) is a
  ``connect`` error, not a wait to the attempt's deadline.
* New connections to one address set (the vetted addresses of one attempt, in the order happy
  eyeballs tries them) are opened one at a time: the next starts when the TCP of the one in
  flight is established (its TLS handshake may go on) or it failed, so a burst never sends a
  burst of SYNs into a small accept queue (the standard library's server listens with a backlog
  of 5). To a single address the SYN is sent at once and, when the kernel completed the handshake
  within the non-blocking ``connect()`` (loopback, a LAN), the turn passes on in the same call:
  the ramp waits for no event-loop iteration. A request waiting its turn takes an idle
  keep-alive connection to its origin as soon as the pool hands one back (at a pinned address,
  when pins apply); its wait counts against its connect timeout, and a connect timeout that ran
  out while it waited is the same ``connect`` error. The request that opened a connect takes a
  connection handed back first, too: the connect then goes on for the pool (a dropped SYN delays
  the pool's growth, not a request).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import functools
import socket
import ssl
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import aiohappyeyeballs
from aiohttp.abc import AbstractResolver

from fireledger.security.egress import EgressPolicy, GuardedResolver, guarded_socket_factory

from .timers import Timers
from .wire import _TCP_INFO, AddressNotVerified, Connection, ExchangeError, Origin, Target, _describe, _norm

__all__ = ["CONNECT_TIMEOUT_S", "DNS_TTL_S", "ConnectStats", "Dialer"]

#: A host name's vetted addresses are reused for new connections this long (aiohttp's default too).
DNS_TTL_S = 10.0
HAPPY_EYEBALLS_DELAY_S = 0.25
#: Default bound on establishing a connection and on the receiver's TCP acknowledging a request.
CONNECT_TIMEOUT_S = 5.0
#: What new connections are opened to, one at a time: the addresses (sockaddr tuples, in the order
#: happy eyeballs tries them) of one connection attempt.
DialKey = tuple[Any, ...]
_TCP_ESTABLISHED = 1   # tcp_info.tcpi_state (linux/tcp_states.h)
#: What a request waiting for a connection is woken with, besides a connection handed over or its
#: own connect's task.
_EXPIRED = "expired"    # its connect bound (or deadline) passed first
_CLOSED = "closed"      # the pool was closed


class ConnectStats(NamedTuple):
    """New connections of a pool now: ``in_flight`` connects whose TCP is not yet established (or
    failed), ``waiting`` requests waiting for the one in flight to their addresses, and
    ``most_in_flight`` — the most connects that were ever in flight to one address set at once
    (decision 0241: 1)."""

    in_flight: int
    waiting: int
    most_in_flight: int


class _DialWait:
    """A request waiting for a connection: ``fut`` gets a connection handed over, the ``task`` of
    its own connect when that ends, ``_EXPIRED`` or ``_CLOSED``. ``task`` is None while it waits its
    turn to open one; ``spec`` is what that connect needs (target, addresses, connect bound,
    deadline, whether the bound ends first). ``origin`` and ``pins`` say which idle connections it
    may be handed (those of its origin, connected to a pinned address)."""

    __slots__ = ("fut", "origin", "pins", "spec", "task")

    def __init__(self, fut: asyncio.Future[object], origin: Origin, pins: frozenset[str] | None,
                 spec: tuple[Target, list[tuple[Any, ...]], float, float, bool]) -> None:
        self.fut = fut
        self.origin = origin
        self.pins = pins
        self.spec = spec
        self.task: asyncio.Task[Connection] | None = None


class Dialer:
    """Opens the new connections of one pool (see the module docstring), bound to ``loop``; its
    waits are armed on the pool's ``timers``. ``on_lost`` is each connection's close callback,
    ``make_room`` runs just before a connect starts (the pool closes an idle connection when its
    limit is reached), ``adopt`` takes a connection nobody waits for into the pool (one handed to a
    request cancelled before using it, or a connect that ended after the request that opened it
    was served by another connection). :attr:`waits` is non-empty while requests wait for a
    connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, policy: EgressPolicy,
                 ssl_context: ssl.SSLContext | None, resolver: AbstractResolver | None,
                 connect_timeout_s: float, timers: Timers, on_lost: Callable[[Connection], None],
                 make_room: Callable[[], None], adopt: Callable[[Connection], None]) -> None:
        self.loop = loop
        self.connect_timeout_s = connect_timeout_s
        self._policy = policy
        self._resolver = GuardedResolver(policy, resolver)
        self._socket_factory: Callable[[tuple[Any, ...]], socket.socket] = guarded_socket_factory(policy)
        self._ssl_context = ssl_context
        self._dns: dict[tuple[str, int], tuple[float, list[tuple[Any, ...]]]] = {}
        self._timers = timers
        self._on_lost = on_lost
        self._make_room = make_room
        self._adopt = adopt
        self._dials: set[asyncio.Task[Connection]] = set()
        #: connects in flight per address set (1 at most: the others wait in ``waits``)
        self._dialing: dict[DialKey, int] = {}
        self.waits: dict[DialKey, collections.deque[_DialWait]] = {}
        #: the most connects that were ever in flight to one address set at once
        self.most_connecting = 0
        self.closed = False

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
            raise ExchangeError("dns", f"cannot resolve {host}: {_describe(exc)}", sent=False) from None
        infos = []
        for h in hosts:
            fam = h["family"]
            addr = (h["host"], h["port"], 0, 0) if fam == socket.AF_INET6 else (h["host"], h["port"])
            infos.append((fam, socket.SOCK_STREAM, h["proto"] or socket.IPPROTO_TCP, "", addr))
        if len(self._dns) > 1024:
            self._dns.clear()
        self._dns[key] = (now + DNS_TTL_S, infos)
        return infos

    async def connect(self, target: Target, deadline: float, pins: frozenset[str] | None = None) -> Connection:
        """A new connection to ``target``: resolved and vetted by the end of ``deadline``, then
        established (TCP and TLS) within ``connect_timeout_s`` — a stalled connect (a receiver whose
        accept queue is full drops the SYN) is a ``connect`` error, not a wait to the deadline."""
        scheme, host, port = target.origin
        try:
            async with asyncio.timeout_at(deadline):
                infos = await self._addr_infos(target, pins)
                self._policy.check_scheme(host, scheme)   # after the address: its reason is the graver
            return await self._open(target, infos, deadline, pins if target.ip is None else None)
        except TimeoutError:
            raise ExchangeError("timeout", "timed out connecting", sent=False) from None

    async def _open(self, target: Target, infos: list[tuple[Any, ...]], deadline: float,
                    pins: frozenset[str] | None = None) -> Connection:
        """A connection to ``target`` at one of ``infos``: established (TCP and TLS) within
        ``connect_timeout_s`` of the call — waiting for the connect already in flight to the same
        addresses included — or an idle connection to the origin (at an address in ``pins``, when
        given) handed back first. The request's own connect, once its turn came, goes on for the
        pool if a connection was handed back before it was established."""
        _scheme, host, port = target.origin
        if self.closed:
            raise ExchangeError("closed", "the sender was closed", sent=False)
        bound = self.loop.time() + self.connect_timeout_s
        stalled = bound < deadline   # the connect bound ends first: running out of it is the receiver's
        key: DialKey = tuple(i[4] for i in infos)
        w = _DialWait(self.loop.create_future(), target.origin, pins, (target, infos, bound, deadline, stalled))
        if key in self._dialing:   # one connect in flight per address set: its turn comes in _dialed
            self.waits.setdefault(key, collections.deque()).append(w)
        else:
            self._count_dial(key)
            if self._start(key, w):
                self._dialed(key)   # established within connect(): the address is free again
        timer = self._timers.call_at(min(bound, deadline), _expire_dial, w.fut)
        try:
            got = await w.fut
        except BaseException:   # cancelled: its connect is abandoned with it (as at stop)
            if w.task is not None:
                w.task.cancel()
            if w.fut.done() and not w.fut.cancelled():
                got = w.fut.result()
                if isinstance(got, asyncio.Task) and not got.cancelled() and got.exception() is None:
                    got = got.result()
                if isinstance(got, Connection):
                    self._keep(got)
            raise
        finally:
            timer.cancel()
        if isinstance(got, Connection):
            return got   # handed back first (its own connect, if any, goes on for the pool)
        if isinstance(got, asyncio.Task):   # its own connect ended
            if got.cancelled():   # the pool was closed
                raise ExchangeError("closed", "the sender was closed", sent=False)
            return cast(Connection, got.result())   # established, or its ExchangeError
        if got is _CLOSED:
            raise ExchangeError("closed", "the sender was closed", sent=False)
        if not stalled:
            raise ExchangeError("timeout", "timed out connecting", sent=False)
        why = "" if w.task is not None else (": waited behind the connection being opened to the same "
                                             "address (one at a time)")
        raise ExchangeError("connect", f"cannot connect to {host}:{port}: not accepted within "
                            f"{self.connect_timeout_s:g}s (connect timeout){why}", sent=False)

    def _start(self, key: DialKey, w: _DialWait) -> bool:
        """Open ``w``'s connect to ``key`` (counted in flight already) as a task of its own. To one
        address the SYN is sent here and now, and True is returned when the kernel completed the
        handshake within the ``connect()`` call (loopback, a LAN): the caller passes the turn on at
        once. Otherwise ``w`` stays first in line for a connection handed back meanwhile."""
        target, infos, bound, deadline, stalled = w.spec
        self._make_room()
        sock = self._connect_now(infos[0]) if len(infos) == 1 else None
        early = sock is not None and _tcp_state(sock) == _TCP_ESTABLISHED
        task = w.task = self.loop.create_task(
            self._dial_counted(key, target, infos, bound, deadline, stalled, sock, early))
        self._dials.add(task)
        if not early:
            self.waits.setdefault(key, collections.deque()).appendleft(w)
        task.add_done_callback(functools.partial(self._dial_ended, w))
        return early

    def _connect_now(self, info: tuple[Any, ...]) -> socket.socket | None:
        """A socket to the address ``info`` (vetted by the egress guard) whose non-blocking
        ``connect()`` was issued; None where there is no ``TCP_INFO`` to read its state from, or
        when anything went wrong (the task's ordinary path then connects and says what failed)."""
        if _TCP_INFO is None:
            return None
        try:
            sock = self._socket_factory(info)
        except (OSError, ValueError):
            return None
        try:
            sock.setblocking(False)
            try:
                sock.connect(info[4])
            except BlockingIOError:
                pass   # in progress (or done: on loopback the handshake completes within the call)
        except OSError:
            sock.close()
            return None
        return sock

    async def _dial_counted(self, key: DialKey, target: Target, infos: list[tuple[Any, ...]], bound: float,
                            deadline: float, stalled: bool, sock: socket.socket | None,
                            passed: bool) -> Connection:
        """:meth:`_dial`, the turn passed on (once; ``passed``: already) as soon as TCP is
        established or the connect failed: the next SYN may go while this connection's TLS handshake
        and transport are set up. ``sock``: the connect issued already (:meth:`_connect_now`)."""

        def pass_turn() -> None:
            nonlocal passed
            if not passed:
                passed = True
                self._dialed(key)   # the next request waiting its turn opens the next one

        try:
            return await self._dial(target, infos, bound, deadline, stalled, pass_turn, sock)
        finally:
            pass_turn()

    def _dial_ended(self, w: _DialWait, task: asyncio.Task[Connection]) -> None:
        """``task`` (a connect opened for the request waiting as ``w``) ended: the request gets it,
        or, served meanwhile by another connection (or gone), leaves it to the pool."""
        self._dials.discard(task)
        if not w.fut.done():
            w.fut.set_result(task)
            return
        if task.cancelled() or task.exception() is not None:
            return   # nobody waits for it (the error is retrieved here)
        self._keep(task.result())

    def _keep(self, conn: Connection) -> None:
        """A connection no request holds: into the pool, or closed with a closed pool."""
        if self.closed:
            conn.abort()
        else:
            self._adopt(conn)

    def stats(self) -> ConnectStats:
        """Connects now, and the most ever in flight to one address set at once."""
        waiting = sum(1 for q in self.waits.values() for w in q if not w.fut.done() and w.task is None)
        return ConnectStats(sum(self._dialing.values()), waiting, self.most_connecting)

    def _count_dial(self, key: DialKey) -> None:
        n = self._dialing[key] = self._dialing.get(key, 0) + 1
        if n > self.most_connecting:
            self.most_connecting = n

    def _dialed(self, key: DialKey) -> None:
        """A connect to ``key`` got its TCP established or failed: the first request still waiting
        its turn opens the next one, at once (no wake-up in between) — and, while each of those
        connects is established within its ``connect()`` call, the next, one after the other."""
        self._uncount(key)
        q = self.waits.get(key)
        if q is None:
            return
        while q:
            w = q.popleft()   # requests gone, and openers (their own connect is the one that ended)
            if not w.fut.done() and w.task is None and not self.closed:
                self._count_dial(key)
                if not self._start(key, w):
                    return   # in flight: its end passes the turn on
                self._uncount(key)
        if not q:
            self.waits.pop(key, None)

    def _uncount(self, key: DialKey) -> None:
        left = self._dialing[key] - 1
        if left:
            self._dialing[key] = left
        else:
            del self._dialing[key]

    async def _finish_connect(self, sock: socket.socket, address: Any) -> None:
        """Wait for the connect issued on the non-blocking ``sock`` to end (the loop sees it
        writable); raises ``OSError`` with its error."""
        try:
            await self.loop.sock_connect(sock, address)   # connect() again: EALREADY, then the wait
        except OSError as exc:
            if exc.errno != errno.EISCONN:   # established in between: done
                raise

    def hand_over(self, conn: Connection) -> bool:
        """Hand ``conn`` (just parked) to the first request waiting for a connection to its origin
        that may use it (its address pinned, when pins apply); False when none may, or when
        ``conn`` is no longer usable (the idle list deals with it)."""
        if not conn.usable(self.loop.time()):
            return False
        for key, q in self.waits.items():
            for w in q:
                if (not w.fut.done() and w.origin == conn.origin
                        and (w.pins is None or conn.peer in w.pins)):
                    q.remove(w)
                    if not q:
                        del self.waits[key]
                    w.fut.set_result(conn)
                    return True
        return False

    async def _dial(self, target: Target, infos: list[tuple[Any, ...]], bound: float, deadline: float,
                    stalled: bool, established: Callable[[], None], sock: socket.socket | None) -> Connection:
        """Open a connection (happy eyeballs over ``infos``, or the connect issued on ``sock``; then
        TLS when the target asks) within ``min(bound, deadline)``; ``established`` is called once TCP
        is."""
        _scheme, host, port = target.origin
        try:
            async with asyncio.timeout_at(min(bound, deadline)):
                try:
                    if sock is None:
                        sock = await aiohappyeyeballs.start_connection(
                            infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_S, loop=self.loop,
                            socket_factory=self._socket_factory)
                    elif _tcp_state(sock) != _TCP_ESTABLISHED:
                        await self._finish_connect(sock, infos[0][4])
                except (OSError, RuntimeError) as exc:   # uvloop may say RuntimeError
                    if sock is not None:
                        sock.close()
                    raise ExchangeError("connect", f"cannot connect to {host}:{port}: {_describe(exc)}",
                                        sent=False) from None
                except BaseException:
                    if sock is not None:
                        sock.close()
                    raise
                established()
                conn = Connection(self._on_lost, target.origin)
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
            if stalled:
                raise ExchangeError("connect", f"cannot connect to {host}:{port}: not accepted within "
                                    f"{self.connect_timeout_s:g}s (connect timeout)", sent=False) from None
            raise ExchangeError("timeout", "timed out connecting", sent=False) from None
        if self.closed:
            conn.abort()
            raise ExchangeError("closed", "the sender was closed", sent=False)
        return conn

    async def close(self) -> None:
        """Release the requests waiting to connect (``the sender was closed``) and the resolver; a
        connect in flight ends as closed when it ends. Idempotent."""
        self.closed = True
        for task in list(self._dials):   # their requests end as closed
            task.cancel()
        waits, self.waits = self.waits, {}
        for q in waits.values():
            for w in q:
                if not w.fut.done():
                    w.fut.set_result(_CLOSED)
        await self._resolver.close()


def _expire_dial(fut: asyncio.Future[object]) -> None:
    if not fut.done():
        fut.set_result(_EXPIRED)


def _tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of ``sock`` (Linux ``TCP_INFO``; -1 when it cannot be read)."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)[0] if _TCP_INFO is not None else -1
    except OSError:
        return -1
