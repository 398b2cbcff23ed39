"""Many one-shot timers on one event-loop timer (decision 0235).

Every HTTP attempt used to arm two or three event-loop timers — its deadline, the check that the
receiver's TCP acknowledged the request, and the deadline of a wait for a free connection — and to
cancel them a few milliseconds later, when the response came. A loop timer is a handle the loop
allocates, arms and tears down (≈2 µs of CPU each on uvloop); here a timer is an entry in a heap,
armed in ≈0.5 µs and cancelled by a flag, and the loop holds one timer: for the earliest entry.

Contract of :class:`Timers`: ``call_at(when, fn, *args)`` runs ``fn(*args)`` on the loop once
``loop.time()`` reaches ``when`` — no earlier than the loop would run a ``loop.call_at`` of the same
instant, in the order of ``when`` (then of arming) — unless the returned :class:`Timer` was
cancelled first. A callback that raises is reported to the loop's exception handler and does not
stop the others. :meth:`Timers.close` cancels everything.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

__all__ = ["Timer", "Timers"]


class Timer:
    """One armed timer (cancel it with :meth:`cancel`)."""

    __slots__ = ("args", "cancelled", "fn", "owner", "when")

    def __init__(self, owner: Timers, when: float, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.owner = owner
        self.when = when
        self.fn = fn
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.owner._cancelled()


class Timers:
    """A heap of :class:`Timer` s behind one loop timer (module docstring). Bound to ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._live = 0
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf   # the instant the loop timer is armed for

    def __len__(self) -> int:
        """Timers armed and neither run nor cancelled."""
        return self._live

    def call_at(self, when: float, fn: Callable[..., object], *args: Any) -> Timer:
        t = Timer(self, when, fn, args)
        heapq.heappush(self._heap, (when, next(self._seq), t))
        self._live += 1
        if when < self._at:
            self._arm(when)
        return t

    def call_later(self, delay: float, fn: Callable[..., object], *args: Any) -> Timer:
        return self.call_at(self.loop.time() + delay, fn, *args)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._at = math.inf
        for _, _, t in self._heap:
            t.cancelled = True
        self._heap.clear()
        self._live = 0

    def _cancelled(self) -> None:
        self._live -= 1
        heap = self._heap
        if len(heap) > 64 + 2 * self._live:   # mostly cancelled entries: keep the heap small
            self._heap = [e for e in heap if not e[2].cancelled]
            heapq.heapify(self._heap)

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = when
        self._handle = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        due = max(self.loop.time(), self._at)   # what a loop timer armed for ``_at`` would run now
        self._handle = None
        self._at = math.inf
        while self._heap and (self._heap[0][2].cancelled or self._heap[0][0] <= due):
            _, _, t = heapq.heappop(self._heap)   # (a callback may arm, cancel or compact: no alias)
            if t.cancelled:
                continue
            t.cancelled = True
            self._live -= 1
            try:
                t.fn(*t.args)
            except Exception as exc:
                self.loop.call_exception_handler({"message": "timer callback failed", "exception": exc})
        if self._heap and self._heap[0][0] < self._at:
            self._arm(self._heap[0][0])
