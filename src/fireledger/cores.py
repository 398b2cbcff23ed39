"""How many cores this process may use, and what ``serve`` makes of it (decision 0239)."""

from __future__ import annotations

import os

__all__ = ["default_dispatch_processes", "usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the platform has one (Linux; a
    container's cpuset or ``taskset`` narrows it), else ``os.cpu_count()``; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):   # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


def default_dispatch_processes() -> int:
    """``FIRELEDGER_DISPATCH_PROCESSES``' default: ``min(usable cores, 2)`` — 2 on two or more cores,
    1 on one. A second attempt runner helps on SQLite since the writer queue (decisions 0218, 0222,
    0239); more than 2 was not measured, so more cores do not raise it."""
    return min(usable_cores(), 2)
