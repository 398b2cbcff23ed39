"""The dispatch plane's connection pool: keep-alive HTTP/1.1 connections per origin, opened through
the egress guard, with an adaptive limit per flow (docs/decisions/0075-lean-http-sender.md,
0115-unacknowledged-request-is-not-sent.md, 0116-adaptive-origin-limits.md,
0133-connection-limits-per-flow.md, 0241-one-connect-in-flight-per-address.md).

* :class:`Pool` keeps idle keep-alive connections per origin (scheme, host, port), caps the
  connections in use (``limit`` in all; per flow — one tenant's requests to one endpoint: tenant,
  origin, path — an :class:`~fireledger.dispatch.limiter.AdaptiveLimit` that starts small, grows
  while the receiver keeps up and halves when it cannot take more, never above
  ``limit_per_host``) with a FIFO of waiters per flow, and opens new connections with a
  :class:`~fireledger.dispatch.dial.Dialer`: through the egress guard (invariant 12), happy
  eyeballs over the vetted addresses, TLS with SNI and certificate verification.
* A connection must be established within ``connect_timeout_s``, and a request written on it
  must be acknowledged by the receiver's TCP within the same bound (Linux ``TCP_INFO``): a
  receiver whose accept queue is full completes the handshake on the client's side only and drops
  what follows, so such a request never reached it and is abandoned early as not sent.
* New connections to one address set are opened **one at a time** (the next when the one before
  it is established or failed), so a burst never sends a burst of SYNs into a small accept queue;
  a request waiting its turn takes an idle keep-alive connection to its origin as soon as one is
  handed back (:meth:`Pool._put_idle`), and its wait counts against its connect timeout.

:meth:`Pool.post` raises :class:`~fireledger.dispatch.wire.ExchangeError` (with ``sent`` and a
``kind``) for everything the network or the peer does, ``EgressRefused``/``ValueError`` for what
cannot be sent, and lets ``CancelledError`` through (the connection in use is closed).
"""

from __future__ import annotations

import asyncio
import collections
import ssl

from aiohttp.abc import AbstractResolver

from fireledger.security.egress import EgressPolicy

from .dial import CONNECT_TIMEOUT_S, DNS_TTL_S, ConnectStats, Dialer
from .limiter import AdaptiveLimit
from .timers import Timers
from .wire import KEEPALIVE_S, Connection, ExchangeError, Origin, Reply, Target

__all__ = ["CONNECT_TIMEOUT_S", "DNS_TTL_S", "INITIAL_ORIGIN_LIMIT", "ConnectStats", "Flow", "Pool"]

#: Connections a flow's adaptive limit starts at (never above ``limit_per_host``).
INITIAL_ORIGIN_LIMIT = 4
_LIMITS_MAX = 1024
#: A flow: one tenant's requests to one endpoint — (tenant, origin, path without the query). Slots,
#: waiters and adaptive limits are kept per flow (docs/decisions/0133-connection-limits-per-flow.md).
Flow = tuple[str, Origin, str]
#: Exchange errors that say the receiver could not take the request: the flow's limit is halved.
_DROPS = frozenset({"connect", "unacked", "timeout"})


class Pool:
    """Keep-alive connections per origin, ``limit`` in use at once; per flow (tenant, origin, path)
    at most what the flow's adaptive limit allows (:mod:`fireledger.dispatch.limiter`, never above
    ``limit_per_host``; 0 = capped by ``limit`` only). A flow's requests hold only its own slots
    and its drops lower only its own limit: one tenant's silent endpoint cannot hold the slots of
    another tenant, or of another endpoint, on the same host (invariant 15). Idle connections
    (per origin, shared by the flows) count against ``limit`` too: opening a new one when
    ``limit`` are open closes the oldest idle one. Requests beyond the limits wait, first come
    first served per flow; a request that waited until its deadline is not sent.
    ``connect_timeout_s`` bounds establishing a connection and the receiver's TCP acknowledging a
    request (never beyond the request's own deadline). At most one connection is being opened to
    an address set at a time: the others wait their turn (within their connect timeout) or take an
    idle connection to their origin handed back meanwhile (:meth:`connect_stats`). Bound to ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, limit: int, limit_per_host: int,
                 policy: EgressPolicy, ssl_context: ssl.SSLContext | None,
                 resolver: AbstractResolver | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 initial_origin_limit: int = INITIAL_ORIGIN_LIMIT) -> None:
        self.loop = loop
        self._limit = limit
        self._per_host = limit_per_host
        self.connect_timeout_s = connect_timeout_s
        self._initial = initial_origin_limit
        self._in_use = 0
        self._flow_use: dict[Flow, int] = {}
        self._limits: dict[Flow, AdaptiveLimit] = {}
        self._idle: dict[Origin, list[Connection]] = {}
        self._idle_count = 0
        self._all: set[Connection] = set()
        self._waiters: dict[Flow, collections.deque[asyncio.Future[bool]]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        #: The deadlines of waits and exchanges: heap entries behind one loop timer (decision 0235).
        self.timers = Timers(loop)
        self._dialer = Dialer(loop, policy=policy, ssl_context=ssl_context, resolver=resolver,
                              connect_timeout_s=connect_timeout_s, timers=self.timers, on_lost=self._forget,
                              make_room=self._make_room, adopt=self._adopt)
        self._closed = False

    # --- slots ----------------------------------------------------------------------------------

    def flow_limit(self, flow: Flow) -> AdaptiveLimit:
        """The adaptive limit of ``flow`` (created at its initial value on first use)."""
        lim = self._limits.get(flow)
        if lim is None:
            if len(self._limits) >= _LIMITS_MAX:   # forget flows with nothing in flight
                for f in [f for f in self._limits if f not in self._flow_use]:
                    del self._limits[f]
            cap = self._per_host or self._limit
            lim = self._limits[flow] = AdaptiveLimit(maximum=min(cap, self._limit), initial=self._initial)
        return lim

    def _flow_room(self, flow: Flow) -> bool:
        return self._flow_use.get(flow, 0) < self.flow_limit(flow).allowed

    def _queued(self, flow: Flow) -> bool:
        """Requests of ``flow`` are waiting (those that gave up are dropped from the head)."""
        q = self._waiters.get(flow)
        if q is None:
            return False
        while q and q[0].done():
            q.popleft()
        if not q:
            del self._waiters[flow]
            return False
        return True

    def _can_take(self, flow: Flow) -> bool:
        return self._in_use < self._limit and not self._queued(flow) and self._flow_room(flow)

    def _take(self, flow: Flow) -> None:
        self._in_use += 1
        self._flow_use[flow] = self._flow_use.get(flow, 0) + 1

    def _give_back(self, flow: Flow) -> None:
        self._in_use -= 1
        left = self._flow_use[flow] - 1
        if left:
            self._flow_use[flow] = left
        else:
            del self._flow_use[flow]
        if self._waiters:
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        """Hand free slots to waiters: first come first served within a flow, flows in turn (a
        flow that was handed slots goes to the back of the turn: when the global ``limit`` is what
        holds requests back, the waiting flows take turns). The slot is taken for the waiter: nobody arriving
        later can take it."""
        for flow in list(self._waiters):
            if self._in_use >= self._limit:
                return
            q = self._waiters[flow]
            served = False
            while q and self._in_use < self._limit and self._flow_room(flow):
                fut = q.popleft()
                if not fut.done():
                    self._take(flow)
                    fut.set_result(True)
                    served = True
            if not q or served:
                del self._waiters[flow]
                if q:
                    self._waiters[flow] = q   # served and still waiting: to the back

    async def _wait_slot(self, flow: Flow, deadline: float) -> None:
        full = self._in_use >= self._limit   # why it waits, said only if it waits in vain
        fut: asyncio.Future[bool] = self.loop.create_future()
        self._waiters.setdefault(flow, collections.deque()).append(fut)
        timer = self.timers.call_at(deadline, _expire_waiter, fut)
        try:
            granted = await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.result():
                self._give_back(flow)   # granted, then cancelled before it was used
            raise
        finally:
            timer.cancel()
        if not granted:
            raise ExchangeError("timeout", self._no_slot(flow, full), sent=False)
        if self._closed:
            self._give_back(flow)
            raise ExchangeError("closed", "the sender was closed", sent=False)

    def _no_slot(self, flow: Flow, full: bool) -> str:
        """Why a request of ``flow`` had to wait for a connection (said, if it waited until its
        deadline, in its error; no path: a path may hold a secret): ``full``, the plane's limit was
        in use when it began to wait, else the flow's adaptive limit."""
        _tenant, (_scheme, host, port), _path = flow
        if full:
            why = f"the dispatch plane's connection limit ({self._limit}) was in use"
        else:
            allowed = self.flow_limit(flow).allowed
            why = f"this tenant's adaptive connection limit for the endpoint ({allowed}) was in use"
        return f"no free connection to {host}:{port}: {why}"

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
        conn.park(self.loop.time())
        if self._dialer.waits and self._dialer.hand_over(conn):
            return
        self._idle.setdefault(conn.origin, []).append(conn)
        self._idle_count += 1
        if self._sweep is None:
            self._sweep = self.loop.call_later(KEEPALIVE_S, self._sweep_idle)

    def _adopt(self, conn: Connection) -> None:
        """A connection no request waits for joins the pool (handed to an idle waiter, or parked)."""
        self._all.add(conn)
        self._put_idle(conn)

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
        if conn.idle:
            stack = self._idle.get(conn.origin)
            if stack and conn in stack:
                stack.remove(conn)
                self._idle_count -= 1
                if not stack:
                    del self._idle[conn.origin]

    # --- the exchange ---------------------------------------------------------------------------

    async def post(self, target: Target, data: bytes, deadline: float, body_cap: int,
                   pins: frozenset[str] | None = None, tenant: str = "", since: float | None = None) -> Reply:
        """Write ``data`` on a pooled or new connection to ``target`` and wait for the response
        head (until ``deadline``, a ``loop.time()``), then read and discard at most ``body_cap``
        body bytes within what is left. Raises :class:`ExchangeError` when no head arrived.
        ``pins``: the only addresses a host name may be reached at (the ones its ownership was
        verified at); when it resolves to none of them, :class:`AddressNotVerified` is raised and
        nothing is sent. Ignored for an IP-literal host (the URL names the address). What came of
        the exchange adjusts the adaptive limit of the request's flow — ``tenant``, the origin and
        ``target.path`` — and of that flow only (decision 0133). ``since``: the ``loop.time()`` the
        caller began holding the request back for a slot of its flow (decision 0242): counted as a
        wait here."""
        if self._closed:
            raise ExchangeError("closed", "the sender was closed", sent=False)
        origin = target.origin
        flow: Flow = (tenant, origin, target.path)
        waited = 0.0 if since is None else max(1e-6, self.loop.time() - since)
        if self._can_take(flow):   # a free slot has no eligible waiter (_wake_waiters hands over)
            self._take(flow)
        else:
            queued = self.loop.time()
            await self._wait_slot(flow, deadline)
            waited += self.loop.time() - queued
        lim = self.flow_limit(flow)
        epoch, inflight, started = lim.epoch, self._flow_use.get(flow, 0), self.loop.time()
        conn: Connection | None = None
        try:
            conn = self._pop_idle(origin, pins if target.ip is None else None)
            if conn is None:
                conn = await self._dialer.connect(target, deadline, pins)
                self._all.add(conn)
            reply = await conn.exchange(self.loop, data, deadline, body_cap, self.connect_timeout_s, self.timers)
        except BaseException as exc:
            if conn is not None:
                conn.abort()
            self._give_back(flow)
            if not isinstance(exc, ExchangeError):
                raise
            if waited and exc.kind == "timeout" and not exc.sent:
                # Out of time before sending because the slot came late: the wait is the cause, and
                # it says nothing of the receiver (no drop).
                raise ExchangeError("timeout", f"{exc} after waiting {waited:.2f}s for a free connection "
                                    f"(this tenant's adaptive connection limit for the endpoint)",
                                    sent=False) from None
            if exc.kind in _DROPS:
                lim.on_drop(epoch)
            raise
        if reply.status == 429 or reply.status == 503:
            lim.on_drop(epoch)
        else:
            lim.on_success(self.loop.time() - started, inflight)
        if conn.reusable() and not self._closed:
            self._put_idle(conn)
        else:
            conn.abort()
        self._give_back(flow)
        return reply

    def connect_stats(self) -> ConnectStats:
        """The pool's connects now, and the most ever in flight to one address set at once."""
        return self._dialer.stats()

    async def close(self) -> None:
        """Close every connection (idle and in use) and release the waiters. Idempotent."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self.timers.close()
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
        self._idle_count = 0
        waiters, self._waiters = self._waiters, {}
        for flow, q in waiters.items():
            for fut in q:
                if not fut.done():
                    fut.set_result(True)   # woken to find the pool closed (see _wait_slot)
                    self._take(flow)
        await self._dialer.close()   # the requests waiting to connect end as closed
        await asyncio.sleep(0)   # let the transports run connection_lost


def _expire_waiter(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)
