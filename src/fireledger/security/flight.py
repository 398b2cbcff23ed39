"""Single-flight loads for the attempt runner's per-process caches (decision 0206).

When a cached entry (a target's verification state, a tenant's data key) is missing or stale, every
attempt that needs it at that moment would read the store on its own — at the start of a burst, or
each time the short cache lapses while hundreds of attempts are in flight, that is hundreds of
identical store reads, each a hop to a worker thread. :func:`once` runs one load per key at a time
on the running event loop; the attempts that arrive meanwhile await the same result (or the same
exception). Nothing is cached here: the caller's cache and its freshness bound are unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["once"]

#: Loads in progress, by (event loop, caller's key); an entry is removed when its load finishes.
_LOADING: dict[tuple[int, Hashable], asyncio.Future[Any]] = {}


async def once(key: Hashable, fn: Callable[[], Any]) -> Any:
    """``fn()`` run in a worker thread (``asyncio.to_thread``), at most one at a time per
    ``key`` on this event loop: a caller arriving while a load for ``key`` is in progress awaits
    that load's outcome instead of starting another. A caller cancelled while waiting does not
    cancel the load for the others."""
    loop = asyncio.get_running_loop()
    k = (id(loop), key)
    fut = _LOADING.get(k)
    if fut is None or fut.done() or fut.get_loop() is not loop:   # none, finished, or a closed loop's
        fut = _LOADING[k] = asyncio.ensure_future(asyncio.to_thread(fn))

        def _done(f: asyncio.Future[Any]) -> None:
            if _LOADING.get(k) is f:
                del _LOADING[k]
            if not f.cancelled():
                f.exception()   # retrieved: a failed load with no waiter left is not "never retrieved"

        fut.add_done_callback(_done)
    return await asyncio.shield(fut)
