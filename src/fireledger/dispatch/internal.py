"""``internal`` targets: a Python callable registered by name in the process that dispatches.

An operator embeds fireledger and registers callables before the dispatch plane starts::

    from fireledger.dispatch.internal import register

    @register("reports.build", tenants={"tn_0123…"})   # only these tenants' targets may call it
    def build(call):                                    # call: InternalCall
        ...                                             # return normally → delivered

    register("billing.close_day", close_day, public=True)   # every tenant, said explicitly

A registration is closed by default (docs/decisions/0035): it names the tenants whose internal
targets may call it, or says ``public=True``; one that does neither (or names no tenant, or does
both) is refused with ``ValueError`` at registration, so a callable is never open by omission.

or lists modules that register at import in ``FIRELEDGER_INTERNAL_MODULES`` (comma-separated), which
``fireledger serve`` / ``fireledger dispatch`` import at start.

A target ``{"kind": "internal", "name": "billing.close_day"}`` is stored with the URL
``internal:billing.close_day``. Outcomes of one call (the same classes as an HTTP attempt):

=====================================  ===========================================================
returns (sync or async)                ``delivered``
raises :class:`InternalFailure`        ``failed`` (final; the cause names the exception class only)
raises anything else                   ``retry`` (bounded backoff, same fire key)
no return within the trigger timeout   ``unknown`` (the call may still complete; a thread cannot
                                       be cancelled, a coroutine is cancelled)
name not registered here / tenant      ``retry`` / ``failed``: a process without the registration
not allowed                            may be restarted with it; a refused tenant is final
:data:`PER_CALLABLE_THREADS` calls of  ``retry``, not called: a callable that blocks keeps at most
this callable still running            that many of the shared threads, so it cannot starve the
                                       others (invariant 15)
=====================================  ===========================================================

Exception messages are never recorded (they may carry payload data): only the class name.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fireledger.errors import FireledgerError

from .http import HttpResult

__all__ = [
    "PREFIX",
    "REGISTRY",
    "InternalCall",
    "InternalFailure",
    "InternalRegistry",
    "load_modules",
    "name_problem",
    "register",
]

PREFIX = "internal:"
#: Threads one synchronous callable may hold at once (of the registry's 32): calls past their timeout
#: keep their thread until they return, and a callable that blocks must not take every thread.
PER_CALLABLE_THREADS = 8
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")


class InternalFailure(FireledgerError):
    """Raise from an internal callable to end the fire ``failed`` (no retry)."""


@dataclass(frozen=True, slots=True)
class InternalCall:
    """What an internal callable receives: the same fields as an HTTP dispatch body."""

    fire_key: str
    trigger_id: str
    scheduled_instant: datetime
    attempt: int
    lane: str
    kind: str
    version: int
    payload: Any


Handler = Callable[[InternalCall], Any]


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an internal callable, or None."""
    if not _NAME.fullmatch(name):
        return ("must start with a letter or '_' and contain only letters, digits and . _ : - "
                "(at most 200 characters)")
    return None


@dataclass(frozen=True, slots=True)
class _Entry:
    fn: Handler
    tenants: frozenset[str] | None   # None only for a public registration

    def allows(self, tenant_id: str) -> bool:
        return self.tenants is None or tenant_id in self.tenants


class InternalRegistry:
    """Name → callable (thread-safe). See the module docstring."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._running: dict[str, int] = {}   # name → synchronous calls holding a thread now

    def register(self, name: str, fn: Handler | None = None, *,
                 tenants: Iterable[str] | None = None, public: bool = False) -> Any:
        """Register ``fn`` under ``name`` (also usable as a decorator). Exactly one of: ``tenants``,
        the (non-empty) tenant ids whose targets may call it, or ``public=True``, every tenant's.
        Neither, both, or an empty ``tenants`` raise ``ValueError`` (closed by default). Registering
        a name again replaces it."""
        problem = name_problem(name)
        if problem:
            raise ValueError(f"internal callable name {name!r} {problem}")
        if public and tenants is not None:
            raise ValueError(f"internal callable {name!r}: give tenants or public=True, not both")
        if isinstance(tenants, str):
            raise ValueError(f"internal callable {name!r}: tenants must be a collection of tenant ids, "
                             "not one string")
        allowed = None if tenants is None else frozenset(tenants)
        if not public and not allowed:
            raise ValueError(f"internal callable {name!r} is open to no tenant: name the tenants allowed to "
                             "call it (tenants={...}) or register it with public=True")
        if allowed is not None and not all(isinstance(t, str) and t for t in allowed):
            raise ValueError(f"internal callable {name!r}: tenants must be non-empty tenant id strings")

        def add(f: Handler) -> Handler:
            if not callable(f):
                raise TypeError("an internal target must be callable")
            with self._lock:
                self._entries[name] = _Entry(f, allowed)
            return f

        return add if fn is None else add(fn)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="internal-target")
            return self._pool

    async def call(self, name: str, tenant_id: str, call: InternalCall, timeout_s: float) -> HttpResult:
        """Run one attempt of an internal target and classify it (see the module docstring)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            return HttpResult("retry", None, f"no internal callable {name!r} is registered in this process", 0.0)
        if not entry.allows(tenant_id):
            return HttpResult("failed", None, f"internal callable {name!r} is not open to this tenant", 0.0)
        try:
            async with asyncio.timeout(timeout_s):
                if inspect.iscoroutinefunction(entry.fn):
                    await entry.fn(call)
                else:
                    with self._lock:
                        busy = self._running.get(name, 0)
                    if busy >= PER_CALLABLE_THREADS:
                        return HttpResult("retry", None, f"internal callable {name!r} has {busy} calls still "
                                          "running; not called", 0.0)
                    result = await loop.run_in_executor(self._executor(), self._run_sync, name, entry.fn, call)
                    if inspect.isawaitable(result):
                        await result
        except TimeoutError:
            return HttpResult("unknown", None, f"no return within {timeout_s:g}s", loop.time() - start, sent=True)
        except InternalFailure as exc:
            return HttpResult("failed", None, f"internal callable raised {type(exc).__name__}",
                              loop.time() - start, sent=True)
        except Exception as exc:
            return HttpResult("retry", None, f"internal callable raised {type(exc).__name__}",
                              loop.time() - start, sent=True)
        return HttpResult("delivered", None, None, loop.time() - start, sent=True)

    def _run_sync(self, name: str, fn: Handler, call: InternalCall) -> Any:
        """Run a synchronous callable on a pool thread; the thread counts as the callable's until
        the call returns (also after its attempt timed out)."""
        with self._lock:
            self._running[name] = self._running.get(name, 0) + 1
        try:
            return fn(call)
        finally:
            with self._lock:
                left = self._running.get(name, 1) - 1
                if left > 0:
                    self._running[name] = left
                else:
                    self._running.pop(name, None)


#: The process-wide registry used by the dispatch plane.
REGISTRY = InternalRegistry()


def register(name: str, fn: Handler | None = None, *, tenants: Iterable[str] | None = None,
             public: bool = False) -> Any:
    """Register on the process-wide :data:`REGISTRY` (see :meth:`InternalRegistry.register`)."""
    return REGISTRY.register(name, fn, tenants=tenants, public=public)


def load_modules(spec: str | None) -> list[str]:
    """Import every module named in ``spec`` (comma-separated, e.g. ``FIRELEDGER_INTERNAL_MODULES``)
    so their ``register`` calls run; returns the names imported. ``ValueError`` names a module that
    cannot be imported."""
    done = []
    for name in (spec or "").split(","):
        name = name.strip()
        if not name:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ValueError(f"FIRELEDGER_INTERNAL_MODULES: cannot import {name!r} ({type(exc).__name__})") from None
        done.append(name)
    return done
