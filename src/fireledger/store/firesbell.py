"""The SQLite engine's wake-up between processes: a sidecar file ``<db>-fires.bell`` (decision 0256).

PostgreSQL wakes dispatchers in other processes with ``NOTIFY fireledger_fires`` (decision 0221);
SQLite has no notifications, so a dispatch process that does not run the timing plane itself
(``serve``'s extra dispatch processes, ``fireledger dispatch`` beside ``fireledger timing``) used
to see new fires only at its idle poll (0.25–0.5 s). In a burst that left the second dispatcher of
the embedded default idle while the timing plane was still committing.

Contract (the same as the ``LISTEN`` channel's: a hint, never the only path):

* :meth:`FiresBell.ring` is called *after* the commit of a transaction that inserted or released
  fires (never before: a wake-up must not announce an uncommitted row). It writes 8 fresh random
  bytes at offset 0 of the sidecar (no fsync: the bell carries no data, the database does). It
  never raises: a sidecar that cannot be written is logged once and the bell goes quiet.
* :meth:`FiresBell.watch` polls the sidecar's 8 bytes every ``poll_s`` in a daemon thread and calls
  ``on_ring()`` once per change it sees (several rings between two looks are one call). A ring
  after the watcher's last look always changes the bytes it will read next (each ring writes a new
  random value), so a ring is missed only if its bytes equal the last seen (probability 2⁻⁶⁴).
  Whoever relies on it keeps its own idle poll as the backstop.
* The bell's bytes are random: no payload, count or key of any fire is in the file.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from fireledger.waker import Waker

from .writerlock import Sidecar, sidecar_path

log = logging.getLogger("fireledger.store")

#: Appended to the database path to name the sidecar (8 random bytes, mode 0600).
SUFFIX = "-fires.bell"

#: How often a watcher looks at the bell (seconds): a syscall per look, ≈50 per second.
DEFAULT_POLL_S = 0.02


def bell_path_for(db_path: str) -> str | None:
    """The bell's path for a database file (None: see :func:`.writerlock.sidecar_path`)."""
    return sidecar_path(db_path, SUFFIX)


class FiresBell:
    """One process's handle on ``<db>-fires.bell`` (see the module docstring for the contract)."""

    def __init__(self, db_path: str) -> None:
        self._file = Sidecar(bell_path_for(db_path), "fires bell %s cannot be opened (%s): dispatchers in "
                             "other processes see new fires at their idle poll only")
        self._lock = threading.Lock()
        self.rung = 0

    @property
    def path(self) -> str | None:
        """The bell's path; None without one (no file of its own, or it could not be used)."""
        return self._file.path

    def ring(self) -> None:
        """Wake every watcher of this database (after a commit that made fires due; never raises)."""
        with self._lock:
            fd = self._file.descriptor()
            if fd is None:
                return
            try:
                os.pwrite(fd, os.urandom(8), 0)
                self.rung += 1
            except OSError as exc:
                log.warning("fires bell %s cannot be written (%s): it goes quiet", self.path, exc.strerror)
                self._file.close()
                self._file.path = None

    def _read(self) -> bytes | None:
        with self._lock:
            fd = self._file.descriptor()
            if fd is None:
                return None
            try:
                return os.pread(fd, 8, 0)
            except OSError:
                return None

    def watch(self, on_ring: Callable[[], None], *, poll_s: float = DEFAULT_POLL_S,
              name: str = "fires-bell") -> Waker | None:
        """Call ``on_ring()`` from a daemon thread named ``name`` each time the bell changed since
        the last look (looked at every ``poll_s``); returns the signal that stops the thread, or
        None when there is no sidecar to watch (nothing is started)."""
        if self._read() is None:
            return None
        stop = Waker()   # a timed wait that returns under a faked clock (waker.py)

        def run() -> None:
            last = self._read()
            while not stop.wait(poll_s):
                now = self._read()
                if now is not None and now != last:
                    last = now
                    try:
                        on_ring()
                    except Exception:   # a hint: a failing callback must not end the watcher
                        log.exception("fires bell: the wake-up failed")

        threading.Thread(target=run, name=name, daemon=True).start()
        return stop

    def close(self) -> None:
        with self._lock:
            self._file.close()


__all__ = ["DEFAULT_POLL_S", "SUFFIX", "FiresBell", "bell_path_for"]
