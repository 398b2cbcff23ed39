"""``serve``'s extra dispatch processes (``FIRELEDGER_DISPATCH_PROCESSES``, decisions 0239–0240): their
command line, their supervision by ``serve``, and their end when ``serve`` ends, ``kill -9`` included.

Below :mod:`fireledger.service`: the child's entry (:func:`fireledger.service.dispatch_child`) runs the
dispatch plane; this module only starts, watches and stops processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time

__all__ = ["dispatch_child_command", "end_with_parent", "supervise_dispatchers"]

log = logging.getLogger("fireledger.service")


def dispatch_child_command(db: str) -> list[str]:
    """The command line of one of ``serve``'s extra dispatch processes: ``fireledger dispatch --db db``
    through :func:`fireledger.service.dispatch_child`, which ends it with this process (decision 0240)."""
    return [sys.executable, "-c", "from fireledger.service import dispatch_child; dispatch_child()",
            str(os.getpid()), db]


#: ``prctl(2)`` option: the signal the calling process gets when its parent ends (Linux).
_PR_SET_PDEATHSIG = 1


def end_with_parent(parent_pid: int, poll_s: float = 1.0, *, prctl: bool = True) -> None:
    """Make this process get SIGTERM (its bounded stop, invariant 17) when ``parent_pid``, its parent,
    ends — ``kill -9`` included — so that an extra dispatch process of ``serve`` never outlives it and
    goes on delivering (decision 0240). On Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere a daemon thread
    that checks ``os.getppid()`` every ``poll_s``. A parent already gone ends this process at once
    (``SystemExit(0)``). ``prctl=False``: the thread wherever (tests of the fallback)."""
    import ctypes
    import signal

    armed = False
    if prctl and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent_pid:   # ended before the signal was armed: re-parented already
        log.warning("parent process %d has ended; this dispatch process stops", parent_pid)
        raise SystemExit(0)
    if armed:
        return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


async def supervise_dispatchers(db: str, n: int, stop: asyncio.Event, grace_s: float = 10.0) -> None:
    """Keep ``n`` child ``fireledger dispatch`` processes running until ``stop``; a child that exits
    is started again after a second (logged). On stop each child gets SIGTERM (its attempts in
    flight settle or their leases lapse to another runner) and is waited for. A child is not waited
    for at start (``/healthz`` answers without it) and ends by itself when this process dies, ``kill -9``
    included (:func:`end_with_parent`, decision 0240)."""
    cmd = dispatch_child_command(db)
    children: list[subprocess.Popen[bytes]] = []

    async def keep(slot: int) -> None:
        while not stop.is_set():
            # subprocess.Popen (vfork + exec, nothing but async-signal-safe calls in the child), not the
            # event loop's spawn: uvloop's forked child can block before exec on a lock another thread
            # of this busy process held at the fork, and its parent then waits in spawn with the event
            # loop stopped — no /healthz, no SIGTERM handled (seen: child on a futex, serve hung).
            proc = subprocess.Popen(cmd, close_fds=True)
            children.append(proc)
            log.info("extra dispatch process %d started (pid %d)", slot, proc.pid)
            while proc.poll() is None and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
            if stop.is_set():
                while proc.poll() is None:   # the supervisor has sent SIGTERM (and SIGKILL after grace_s)
                    await asyncio.sleep(0.05)
                children.remove(proc)
                return
            children.remove(proc)
            log.error("extra dispatch process %d exited with %s; starting it again in 1 s", slot, proc.returncode)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    keepers = [asyncio.create_task(keep(i + 1)) for i in range(n)]
    await stop.wait()
    for proc in list(children):
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
    _, late = await asyncio.wait(keepers, timeout=grace_s)
    if late:   # a child that outlives its own bounded stop is killed (invariant 17)
        for proc in list(children):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await asyncio.wait(late, timeout=1.0)
