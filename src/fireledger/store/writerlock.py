"""A cross-process writer queue for one SQLite database: an ``flock`` on ``<db>-writer.lock``.

SQLite lets one writer at a time into a database; a writer that finds the lock taken by another
*process* is retried by SQLite's busy handler, which **sleeps** between tries (1, 2, 5, 10, 15, 20,
25, … up to 100 ms a step), so two processes writing the same store — ``serve`` with
``FIRELEDGER_DISPATCH_PROCESSES=2``, ``serve`` and ``fireledger dispatch``, ``serve`` and an operator
command — lose whole sleep steps on every contended transaction (decisions 0208, 0218). Writers of
one process already queue on a thread lock (:meth:`SqliteEngine.write`); this lock does the same
across processes: every write transaction takes an exclusive ``flock`` on a sidecar file first, so
a waiting writer blocks in the kernel and is woken the moment the holder releases it, with no sleep
steps.

Contract:

* **Only a queue, never the guard.** SQLite's own lock still decides who writes; this lock only
  orders fireledger's writers before they ask for it. A writer that does not take it (the
  ``sqlite3`` shell, Litestream) is met by SQLite's busy timeout as before, and so is a fireledger
  writer when the sidecar cannot be opened (a read-only directory: logged once, then SQLite alone).
* **Held only around one write transaction** — from before ``BEGIN IMMEDIATE`` to after ``COMMIT``
  or ``ROLLBACK``, on every path (``finally``); never across an ``await`` or a network call (the
  store's write transactions are synchronous SQL). Reads never take it. A process that dies (even
  ``kill -9``) releases it: the kernel drops an ``flock`` with the last descriptor of its file.
* **Order: the process's thread lock, then this lock, then SQLite's lock**, everywhere, so they
  cannot deadlock. The checkpoint thread does not take it (a ``PASSIVE`` checkpoint never waits for
  the writer; ``scrub_after_shred`` runs with busy timeout 0).
* **Re-entrant within the thread that holds it** (a depth count, like the thread lock it nests in).
* **The wait is not bounded by this lock**: a holder holds it for at most its own transaction plus
  its own busy timeout (SQLite's lock behind a foreign writer), so a waiter waits for live holders
  only; a *stopped* holder (``SIGSTOP``) stops every writer until it continues — as it does today by
  holding SQLite's lock in the middle of its transaction.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("fireledger.store")

#: Appended to the database path to name the sidecar lock file (empty, mode 0600).
SUFFIX = "-writer.lock"


def sidecar_path(db_path: str, suffix: str) -> str | None:
    """``db_path + suffix`` for a database file, or None for a database without a file of its own
    (``:memory:``, an empty path, a ``file:`` URI)."""
    if not db_path or db_path == ":memory:" or db_path.startswith("file:"):
        return None
    return db_path + suffix


def lock_path_for(db_path: str) -> str | None:
    """The writer queue's sidecar for a database file (None: see :func:`sidecar_path`)."""
    return sidecar_path(db_path, SUFFIX)


class Sidecar:
    """One process's descriptor on a sidecar file beside a SQLite database (mode 0600, created on
    first use, reopened in a forked child). A sidecar that cannot be opened is logged once with
    ``unusable`` (``%s`` is the path, then the reason) and :attr:`path` becomes None for good."""

    def __init__(self, path: str | None, unusable: str) -> None:
        self.path = path
        self._unusable = unusable
        self._fd: int | None = None
        self._pid = 0

    def descriptor(self) -> int | None:
        """The open sidecar, or None when there is none to use."""
        if self.path is None:
            return None
        if self._fd is not None and self._pid == os.getpid():
            return self._fd
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log.warning(self._unusable, self.path, exc.strerror)
            self.path = None
            return None
        self._fd, self._pid = fd, os.getpid()
        return fd

    def close(self) -> None:
        """Close the descriptor (in the process that opened it); a later use reopens it."""
        fd, self._fd = self._fd, None
        if fd is not None and self._pid == os.getpid():
            os.close(fd)


class WriterFileLock:
    """One process's handle on the sidecar lock (see the module docstring for the contract).

    The caller serialises its threads before calling :meth:`held` (the engine's write lock), so one
    descriptor serves the whole process. ``contended`` counts acquisitions that found the lock held
    by another process and waited in the kernel; ``acquired`` counts every outermost acquisition."""

    def __init__(self, db_path: str) -> None:
        # Reopened in a forked child: an ``flock`` belongs to the open file description, which a fork shares.
        self._file = Sidecar(lock_path_for(db_path), "writer queue file %s cannot be opened (%s): writers "
                             "of several processes meet at SQLite's busy timeout only")
        self._depth = 0
        self.acquired = 0
        self.contended = 0

    @property
    def path(self) -> str | None:
        """The sidecar's path; None without one (no file of its own, or it could not be opened)."""
        return self._file.path

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the body (re-entrant); released on every path out of it."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        fd = self._file.descriptor()
        if fd is None:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.contended += 1
            fcntl.flock(fd, fcntl.LOCK_EX)   # the kernel wakes this the moment the holder lets go
        self.acquired += 1
        self._depth = 1
        try:
            yield
        finally:
            self._depth = 0
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the descriptor (releasing the lock if held); a later :meth:`held` reopens it."""
        self._file.close()
