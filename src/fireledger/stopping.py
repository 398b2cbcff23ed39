"""Bounded stop (DESIGN.md invariant 17): every process exits within a bounded time of SIGTERM.

``fireledger serve``, ``control``, ``timing`` and ``dispatch`` install a :class:`StopGuard` for
SIGTERM and SIGINT. The first signal asks the planes to stop (they drain with a deadline: attempts
in flight, results to record, open HTTP requests) and arms a watchdog thread. If the process has
not exited :func:`stop_timeout_s` seconds after that signal — a thread blocked in a callable or in
a store call, a plane that does not return — the watchdog logs what it does and ends the process
with ``os._exit`` (exit status 3). The watchdog is a daemon thread, so it also covers the
interpreter's own exit (which joins worker threads that may never return).

The handler is a plain ``signal.signal`` handler, so it runs even when the event loop is busy
(Python runs signal handlers between bytecodes of the main thread).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType

log = logging.getLogger("fireledger.service")

STOP_TIMEOUT_ENV = "FIRELEDGER_STOP_TIMEOUT_S"
DEFAULT_STOP_TIMEOUT_S = 10.0
FORCED_EXIT_STATUS = 3

__all__ = ["DEFAULT_STOP_TIMEOUT_S", "FORCED_EXIT_STATUS", "STOP_TIMEOUT_ENV", "StopGuard", "stop_timeout_s"]


def stop_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """``FIRELEDGER_STOP_TIMEOUT_S`` (default 10): seconds from SIGTERM to exit, at most. A number
    from 1 to 600; ``ValueError`` naming the variable otherwise."""
    from fireledger.settings import parse_stop_timeout_s, process_env

    return parse_stop_timeout_s(process_env() if env is None else env)


class StopGuard:
    """Turns SIGTERM/SIGINT into a stop request plus a watchdog (see the module docstring).

    ``on_stop`` is called (from the signal handler, in the main thread) at the first signal; it must
    only schedule work (e.g. ``loop.call_soon_threadsafe(event.set)``). A second signal changes
    nothing: the deadline set by the first one holds.
    """

    def __init__(self, timeout_s: float, on_stop: Callable[[], None],
                 exit_fn: Callable[[int], None] = os._exit) -> None:
        self.timeout_s = timeout_s
        self.on_stop = on_stop
        self.exit_fn = exit_fn
        self.signalled_at: float | None = None
        self._armed = threading.Event()
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        """Handle SIGTERM/SIGINT (main thread only: elsewhere, e.g. embedded in a thread, the
        embedder owns the signals and calls :meth:`trigger`)."""
        if threading.current_thread() is not threading.main_thread():
            log.debug("not in the main thread: SIGTERM/SIGINT are left to the embedding program")
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.trigger(signal.Signals(signum).name)

    def trigger(self, why: str) -> None:
        """Begin a bounded stop (idempotent): arm the watchdog, then ask the planes to stop."""
        if self._armed.is_set():
            return
        self._armed.set()
        self.signalled_at = time.monotonic()
        log.info("%s: stopping (exit within %.0f s)", why, self.timeout_s)
        threading.Thread(target=self._watch, name="stop-watchdog", daemon=True).start()
        self.on_stop()

    def _watch(self) -> None:
        assert self.signalled_at is not None
        time.sleep(max(0.0, self.signalled_at + self.timeout_s - time.monotonic()))
        busy = sorted(t.name for t in threading.enumerate()
                      if t is not threading.current_thread() and not t.daemon and t.is_alive())
        log.error("did not stop within %.0f s of the stop signal (threads still running: %s); exiting now",
                  self.timeout_s, ", ".join(busy) or "none")
        for h in logging.getLogger().handlers:
            try:
                h.flush()
            except Exception:
                pass
        self.exit_fn(FORCED_EXIT_STATUS)
