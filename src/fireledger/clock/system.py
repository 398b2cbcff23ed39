"""The system clock with an honest error bound.

ε comes from the best source that can justify it:

* the kernel, when it says it is synchronised (``adjtimex``: status without ``STA_UNSYNC``;
  ``maxerror`` in µs is the bound);
* otherwise a declared bound (``FIRELEDGER_DECLARED_EPS_MS``, default 5 ms) — said loudly at start,
  in ``/metrics`` and on every fire via the recorded source ``declared``.

PostgreSQL deployments add a cross-check against the server's clock (the timing plane measures
offset and round trip and widens the interval accordingly).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

from .base import Interval

_STA_UNSYNC = 0x0040


class _Timex(ctypes.Structure):
    _fields_ = [
        ("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
        ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
        ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long), ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
        ("_pad", ctypes.c_int * 11),
    ]


_LIBC: list[ctypes.CDLL | None] = []   # the C library, looked up once per process (None: not found)


def _libc() -> ctypes.CDLL | None:
    """The C library, loaded once: ``find_library`` runs ``ldconfig -p`` (a child process) each call,
    and the clock refreshes its bound every second in every process (decision 0150)."""
    if not _LIBC:
        try:
            _LIBC.append(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True))
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]


def kernel_error_bound() -> tuple[bool, int | None]:
    """``(synchronised, maxerror_us)`` from ``adjtimex``; ``(False, None)`` where unavailable."""
    libc = _libc()
    if libc is None:
        return False, None
    try:
        tx = _Timex()
        rc = libc.adjtimex(ctypes.byref(tx))
    except (OSError, AttributeError):
        return False, None
    if rc < 0:
        return False, None
    synced = not (tx.status & _STA_UNSYNC) and rc != 5  # 5 = TIME_ERROR
    return synced, int(tx.maxerror)


#: The declared clock bound when none is given (``FIRELEDGER_DECLARED_EPS_MS`` default: 5 ms).
DEFAULT_DECLARED_EPS_US = 5_000


class SystemClock:
    """``time.time_ns()`` widened by ε from the kernel or a declared bound."""

    def __init__(self, declared_eps_us: int | None = None, refresh_s: float = 1.0) -> None:
        """``declared_eps_us``: the bound used when the kernel gives none; the process passes
        ``Settings.declared_eps_us`` (``FIRELEDGER_DECLARED_EPS_MS``); None: 5 ms."""
        if declared_eps_us is None:
            declared_eps_us = DEFAULT_DECLARED_EPS_US
        self.declared_eps_us = declared_eps_us
        self.refresh_s = refresh_s
        self._checked = -1e9
        self._eps_us = declared_eps_us
        self._source = "declared"
        self.extra_eps_us = 0  # added by a store cross-check (PostgreSQL)
        self._refresh()

    def _refresh(self) -> None:
        synced, maxerror = kernel_error_bound()
        if synced and maxerror is not None:
            self._eps_us, self._source = maxerror, "kernel"
        else:
            self._eps_us, self._source = self.declared_eps_us, "declared"
        self._checked = time.monotonic()

    def now(self) -> Interval:
        mono = time.monotonic()
        if mono - self._checked > self.refresh_s:
            self._refresh()
        t = time.time_ns() // 1000
        eps = self._eps_us + self.extra_eps_us
        return Interval(t - eps, t + eps, self._source)

    def monotonic(self) -> float:
        return time.monotonic()

    @property
    def source(self) -> str:
        return self._source
