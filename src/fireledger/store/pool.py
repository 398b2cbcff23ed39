"""Connections per live thread: each thread that uses the store holds its own connection; when the
thread exits, its connection goes back to a small idle set (at most ``max_idle``) or is closed, so
the number of open connections follows the live threads, not every thread that ever ran."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

#: Idle connections kept for the next new thread (beyond this, a dead thread's connection is closed).
DEFAULT_MAX_IDLE = 4


class _Held:
    """A thread's claim on one connection; when the thread exits its thread-local dies with it and
    the finalizer hands the connection back to the pool."""

    __slots__ = ("__weakref__", "conn", "generation")

    def __init__(self, conn: Any, generation: int = 0) -> None:
        self.conn = conn
        self.generation = generation


class ConnectionPool:
    """Connections held by live threads, plus at most ``max_idle`` idle ones (module docstring).

    ``opener()`` opens a connection; ``reusable(conn)`` says whether a released one may serve
    another thread (not closed, not inside a transaction); ``closer(conn)`` closes one quietly."""

    def __init__(self, opener: Callable[[], Any], reusable: Callable[[Any], bool],
                 closer: Callable[[Any], None], max_idle: int = DEFAULT_MAX_IDLE) -> None:
        self._opener = opener
        self._reusable = reusable
        self._closer = closer
        self.max_idle = max_idle
        self._local = threading.local()
        self._lock = threading.RLock()   # a finalizer may run on a thread already inside the pool
        self._open: dict[int, Any] = {}     # id → every open connection (held or idle)
        self._idle: list[Any] = []
        self.generation = 0   # bumped by invalidate(): connections opened before are suspect

    def get(self, valid: Callable[[Any], bool] = lambda c: True) -> Any:
        """This thread's connection (taken from the idle ones, or opened, on first use; replaced
        when ``valid(conn)`` is false, e.g. a PostgreSQL connection that was closed)."""
        held: _Held | None = getattr(self._local, "held", None)
        if held is not None:
            stale = held.generation != self.generation and self._reusable(held.conn)   # never mid-transaction
            if valid(held.conn) and not stale:
                return held.conn
            self._discard(held.conn)
        conn = None
        with self._lock:
            while self._idle and conn is None:
                cand = self._idle.pop()
                if valid(cand):
                    conn = cand
                else:
                    self._open.pop(id(cand), None)
                    self._closer(cand)
        if conn is None:
            conn = self._opener()
            with self._lock:
                self._open[id(conn)] = conn
        held = _Held(conn, self.generation)
        fin = weakref.finalize(held, self._give_back, conn)
        fin.atexit = False
        self._local.held = held
        return conn

    def _discard(self, conn: Any) -> None:
        with self._lock:
            self._open.pop(id(conn), None)
        self._closer(conn)

    def _give_back(self, conn: Any) -> None:
        """A thread that held ``conn`` ended: keep it idle (up to ``max_idle``) or close it."""
        with self._lock:
            if self._open.get(id(conn)) is not conn:
                return                          # closed meanwhile by close_all()
            keep = len(self._idle) < self.max_idle and self._reusable(conn)
            if keep:
                self._idle.append(conn)
            else:
                del self._open[id(conn)]
        if not keep:
            self._closer(conn)

    def invalidate(self) -> None:
        """A connection was found broken (its server went away, e.g. a failover): close the idle
        connections now, and have every thread replace the one it holds at its next call (outside a
        transaction) instead of finding it dead with a failed statement."""
        with self._lock:
            self.generation += 1
            idle, self._idle = self._idle, []
            for c in idle:
                self._open.pop(id(c), None)
        for c in idle:
            self._closer(c)

    def open_connections(self) -> list[Any]:
        """Every open connection (held by a live thread or idle)."""
        with self._lock:
            return list(self._open.values())

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    def close_all(self) -> None:
        """Close every connection; threads that held one open a new one on their next call."""
        with self._lock:
            conns = list(self._open.values())
            self._open.clear()
            self._idle.clear()
            old, self._local = self._local, threading.local()
        del old   # this thread's claim dies here: its finalizer finds the connection gone and ignores it
        for c in conns:
            self._closer(c)
