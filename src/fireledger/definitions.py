"""From a stored trigger version to its compiled recurrence, and the next instant in microseconds.

One cache of compiled recurrences per process, keyed by (trigger, version): a version is immutable,
so the cache needs no invalidation (an amendment is a new key); identical schedules compile once.
Used by the timing loop, the control plane (first instant, preview) and the shadow rebuilder, so all
of them agree by construction.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from threading import Lock
from typing import Any

from fireledger.domain.keys import from_us, to_us
from fireledger.domain.model import TriggerVersion
from fireledger.recurrence import Recurrence, compile_spec, next_after

_CACHE: OrderedDict[tuple[str, int], Recurrence] = OrderedDict()
_LOCK = Lock()
_CACHE_MAX = 2_000_000
# Compiling is pure, so versions with the same stored schedule share one compiled recurrence (a
# thousand triggers on "0 9 * * 1-5" in one zone compile once; intervals carry their own anchor).
_BY_SPEC: OrderedDict[Any, Recurrence] = OrderedDict()
_SPEC_MAX = 100_000


def _spec_key(schedule: dict[str, Any]) -> Any:
    """A hashable key equal for equal schedules (flat dicts of scalars — cheap — or JSON text)."""
    items = tuple(sorted(schedule.items()))
    if all(isinstance(v, str | int | float | bool) or v is None for _, v in items):
        return tuple((k, type(v), v) for k, v in items)   # typed: 1, 1.0 and True stay apart
    return json.dumps(schedule, sort_keys=True, separators=(",", ":"))


def compile_schedule(schedule: dict[str, Any]) -> Recurrence:
    """Compile a stored schedule (intervals always carry their anchor once stored)."""
    return compile_spec(schedule)


def recurrence_of(v: TriggerVersion) -> Recurrence:
    """The compiled recurrence of a stored version (cached by trigger and version)."""
    return recurrence_for(v.trigger_id, v.version, v.schedule)


def recurrence_for(trigger_id: str, version: int, schedule: dict[str, Any]) -> Recurrence:
    key = (trigger_id, version)
    with _LOCK:
        rec = _CACHE.get(key)
        if rec is not None:
            return rec
    spec = _spec_key(schedule)
    with _LOCK:
        rec = _BY_SPEC.get(spec)
    if rec is None:
        rec = compile_spec(schedule)
    with _LOCK:
        _BY_SPEC[spec] = rec
        if len(_BY_SPEC) > _SPEC_MAX:
            _BY_SPEC.popitem(last=False)
        _CACHE[key] = rec
        if len(_CACHE) > _CACHE_MAX:
            _CACHE.popitem(last=False)
    return rec


def next_us(rec: Recurrence, after_us: int) -> int | None:
    """The first instant strictly after ``after_us`` in microseconds, or None when exhausted."""
    nxt = next_after(rec, from_us(after_us))
    return None if nxt is None else to_us(nxt)
