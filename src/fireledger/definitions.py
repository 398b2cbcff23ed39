"""From a stored trigger version to its compiled recurrence, and the next instant in microseconds.

One cache of compiled recurrences per process, keyed by (trigger, version): a version is immutable,
so the cache needs no invalidation (an amendment is a new key); identical schedules compile once.
Used by the timing loop, the control plane (first instant, preview) and the shadow rebuilder, so all
of them agree by construction.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from threading import Lock
from typing import Any

from fireledger.domain.keys import from_us, to_us
from fireledger.domain.model import TriggerVersion
from fireledger.recurrence import (
    IntervalRecurrence,
    OneShotRecurrence,
    Recurrence,
    UnionRecurrence,
    compile_spec,
    next_after,
)
from fireledger.recurrence.union import matched_us, union_next_fn

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


#: Compiled recurrences and their next-instant functions by stored schedule text (the timing plane
#: reads the text; equal texts are equal schedules, so they need neither a JSON decode nor a compile
#: once one of them was compiled).
_BY_TEXT: dict[str, tuple[Recurrence, Callable[[int], int | None]]] = {}


def plan_for_text(trigger_id: str, version: int, text: str) -> tuple[Recurrence, Callable[[int], int | None]]:
    """The compiled recurrence of a version from its schedule as stored (its JSON text), with its
    :func:`next_fn`: cached by text (and the recurrence by (trigger, version), as
    :func:`recurrence_for`). Raises what decoding or compiling the schedule raises."""
    with _LOCK:
        got = _BY_TEXT.get(text)
        if got is not None:
            _CACHE[(trigger_id, version)] = got[0]
            if len(_CACHE) > _CACHE_MAX:
                _CACHE.popitem(last=False)
            return got
    rec = recurrence_for(trigger_id, version, json.loads(text))
    got = (rec, next_fn(rec))
    with _LOCK:
        if len(_BY_TEXT) >= _SPEC_MAX:
            _BY_TEXT.clear()
        _BY_TEXT[text] = got
    return got


def next_us(rec: Recurrence, after_us: int) -> int | None:
    """The first instant strictly after ``after_us`` in microseconds, or None when exhausted."""
    nxt = next_after(rec, from_us(after_us))
    return None if nxt is None else to_us(nxt)


#: The instants a datetime can hold, in µs (0001-01-01 and 9999-12-31T23:59:59.999999, UTC).
_MIN_US = to_us(datetime.min.replace(tzinfo=UTC))
_MAX_US = to_us(datetime.max.replace(tzinfo=UTC))
_US = timedelta(microseconds=1)
NextFn = Callable[[int], int | None]


def next_fn(rec: Recurrence) -> NextFn:
    """``partial(next_us, rec)``, equal to it for every ``after_us``, in integer arithmetic where the
    recurrence allows (intervals and one-shots: no datetime per call — the timing loop calls it once
    per fire); cron schedules, wall-time rules, go through :func:`next_us`. Build it once per
    compiled recurrence (the timing loop caches it with the version). A union's: the minimum of its
    members' (decision 0155)."""
    slow: NextFn = partial(next_us, rec)
    w = rec.window
    nb = None if w.not_before is None else to_us(w.not_before)
    na = None if w.not_after is None else to_us(w.not_after)
    if isinstance(rec, UnionRecurrence):
        return union_next_fn([next_fn(m) for m in rec.members], nb, na)
    if isinstance(rec, IntervalRecurrence):
        anchor, every = to_us(rec.anchor), rec.every // _US

        def interval(after_us: int) -> int | None:
            if not _MIN_US <= after_us <= _MAX_US:
                return slow(after_us)   # out of the representable range: next_us decides (raises)
            if nb is not None and after_us < nb:
                after_us = nb - 1
            t = anchor if after_us < anchor else anchor + ((after_us - anchor) // every + 1) * every
            return None if t > _MAX_US or (na is not None and t > na) else t

        return interval
    if isinstance(rec, OneShotRecurrence):
        at = to_us(rec.at)

        def once(after_us: int) -> int | None:
            if not _MIN_US <= after_us <= _MAX_US:
                return slow(after_us)
            if nb is not None and after_us < nb:
                after_us = nb - 1
            return None if at <= after_us or (na is not None and at > na) else at

        return once
    return slow


def matched_fn(rec: Recurrence) -> Callable[[int], tuple[int, ...]] | None:
    """For a union: the function giving the indexes of the specs an instant (µs) came from; None for
    a single-spec schedule (decision 0155)."""
    if not isinstance(rec, UnionRecurrence):
        return None
    fns = [next_fn(m) for m in rec.members]
    return partial(matched_us, fns)
