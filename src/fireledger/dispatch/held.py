"""Attempts held by the runner until their flow has a free connection (decision 0242).

A claim round may admit more HTTP attempts of one flow (tenant, origin, path; decision 0133) than
the flow's adaptive limit lets be in flight. :class:`FlowGate` counts, per flow, the attempts
started and not ended, and keeps the others as plain entries (:class:`Held`, no task) in a
first-come-first-served queue per flow:

* :meth:`FlowGate.may_start` — an attempt may start now: no older one of its flow is held and
  fewer than ``allowed`` are started (then it counts as started);
* :meth:`FlowGate.hold` — keep it, with a timer at its timeout that hands it to ``on_expired``
  (removed from the queue first: it is never also started);
* :meth:`FlowGate.release` — an attempt of the flow ended: the held ones to start now, oldest
  first, while fewer than ``allowed`` are started;
* :meth:`FlowGate.drop` — forget every held entry (stop past its drain) and return them.

Pure bookkeeping on the event loop; the caller starts, settles and counts the attempts.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from .pool import Flow
from .timers import Timer, Timers

__all__ = ["FlowGate", "Held"]


class Held:
    """One held attempt: ``item`` (the caller's), its ``flow``, the ``loop.time()`` it began to wait
    (``since``: its timeout counts from then) and the timer that expires it."""

    __slots__ = ("flow", "item", "since", "timer")

    def __init__(self, item: Any, flow: Flow, since: float) -> None:
        self.item = item
        self.flow = flow
        self.since = since
        self.timer: Timer | None = None


class FlowGate:
    """Per flow: attempts started and not ended (:attr:`busy`) and the queue of held ones (module
    docstring). :attr:`held` is how many are held now."""

    def __init__(self) -> None:
        self.busy: dict[Flow, int] = {}
        self.queues: dict[Flow, deque[Held]] = {}
        self.held = 0
        self._timers: Timers | None = None

    def may_start(self, flow: Flow, allowed: Callable[[Flow], int]) -> bool:
        busy = self.busy.get(flow, 0)
        if flow in self.queues or busy >= allowed(flow):
            return False
        self.busy[flow] = busy + 1
        return True

    def hold(self, item: Any, flow: Flow, timeout_s: float, on_expired: Callable[[Held], None]) -> None:
        loop = asyncio.get_running_loop()
        timers = self._timers
        if timers is None or timers.loop is not loop:
            timers = self._timers = Timers(loop)
        h = Held(item, flow, loop.time())
        h.timer = timers.call_at(h.since + timeout_s, self._expire, h, on_expired)
        q = self.queues.get(flow)
        if q is None:
            q = self.queues[flow] = deque()
        q.append(h)
        self.held += 1

    def _expire(self, h: Held, on_expired: Callable[[Held], None]) -> None:
        q = self.queues.get(h.flow)
        if q is None or h not in q:
            return
        q.remove(h)
        if not q:
            del self.queues[h.flow]
        self.held -= 1
        on_expired(h)

    def release(self, flow: Flow, allowed: Callable[[Flow], int]) -> list[Held]:
        """One attempt of ``flow`` ended; the held ones to start now (counted as started)."""
        busy = self.busy[flow] - 1
        out: list[Held] = []
        q = self.queues.get(flow)
        if q is not None:
            room = allowed(flow)
            while q and busy < room:
                h = q.popleft()
                if h.timer is not None:
                    h.timer.cancel()
                out.append(h)
                busy += 1
            if not q:
                del self.queues[flow]
            self.held -= len(out)
        if busy:
            self.busy[flow] = busy
        else:
            del self.busy[flow]
        return out

    def drop(self) -> list[Held]:
        """Forget every held entry (their timers cancelled) and return them."""
        out = [h for q in self.queues.values() for h in q]
        for h in out:
            if h.timer is not None:
                h.timer.cancel()
        self.queues.clear()
        self.held = 0
        return out

    def close(self) -> None:
        if self._timers is not None:
            self._timers.close()
            self._timers = None
