"""The signal every thread of the service sleeps on when it sleeps with a timeout (decisions 0237, 0245).

``threading.Event.wait(timeout)`` sleeps on an *absolute* deadline (``sem_clockwait`` on the
monotonic clock). Under libfaketime — the falsification scenarios' and end-to-end tests' faked
clock, and any operator who runs the service that way — the deadline is computed from the faked
clock and compared by the kernel with the real one, so a timed wait does not return for as long as
the fake is ahead (a year for a 2027 clock): the timing loop of decision 0227 never woke up again,
and the lease, shadow, session-heartbeat, listener-reconnect, denial-flush and WAL-checkpoint threads
did one round and then slept for good. :class:`Waker` has the same ``set`` / ``clear`` / ``wait``
contract but sleeps in ``poll`` on a pipe with a *relative* timeout, as the event loop's ``epoll``
always did. Every thread that waits with a timeout waits on a Waker (a test reads the package for
``threading.Event``).

Contract:

* :meth:`set` may be called from any thread, any number of times; it never blocks.
* Any number of threads may :meth:`wait` at once (a timing node's lease, shadow and session threads
  share its stop signal); a set ends every wait.
* :meth:`wait` returns True as soon as the signal is set (at once if it already is), False after
  ``timeout`` seconds without it (None: no limit). It never returns False before the timeout.
* :meth:`clear` resets the signal; a :meth:`set` that races with it may be lost, exactly as with
  ``threading.Event`` — the caller clears *before* the work that a set asks for, so that work sees
  what the setter changed.
"""

from __future__ import annotations

import os
import select
import time
import weakref


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Waker:
    """A set/clear/wait signal whose timed wait is a relative ``poll`` (see the module docstring)."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._flag = False
        # the pipe's ends close with the object (never explicitly: a late set() from another thread
        # must not write into a descriptor number that was closed and reused)
        weakref.finalize(self, _close, self._r, self._w)

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        try:
            os.write(self._w, b"\0")
        except OSError:   # the pipe is full (already readable): nothing more to do
            pass

    def clear(self) -> None:
        self._flag = False
        self._drain()

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        end = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            left_ms = None if end is None else max(0.0, (end - time.monotonic()) * 1000.0)
            poller = select.poll()   # one per wait: a poll object must not be polled by two threads at once
            poller.register(self._r, select.POLLIN)
            ready = poller.poll(left_ms)
            if self._flag:
                return True
            if not ready or (end is not None and time.monotonic() >= end):
                return False
            self._drain()   # a byte left by a set() that a clear() then cancelled: wait on

    def _drain(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except OSError:   # BlockingIOError: empty
            pass
