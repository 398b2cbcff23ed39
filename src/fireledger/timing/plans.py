"""What the timing loop keeps between cycles to plan a due row without reading or compiling again.

* :class:`VersionPlans` — per trigger version, its policies and its next-instant function (compiled
  once: a version is immutable, so the cache is keyed by (trigger, version) and never invalidated;
  bounded, a version evicted is read again in its batch's one statement). Versions a batch needs and
  the cache lacks are read in ONE statement (``store.timing.version_plans``: schedule text and
  policies, never the sealed payload); a version that does not decode there is read alone, so one bad
  row fails alone.
* :attr:`Plan.label` — the DST labeller of a cron version (decision 0160): the label of each decided
  instant (``"gap <wall>"`` / ``"fold <wall>"``), from the same compiled recurrence; None for
  intervals and one-shots, so their fires cost nothing more (:func:`labelled`).
* :func:`gc_paused` — the cyclic garbage collector held off while one batch is planned and committed
  (decision 0136): a batch allocates thousands of short-lived objects (rows, fire records,
  decisions) that reference counting frees, and each collection the allocations would trigger
  traverses every live object of the process — measured, that was up to half the CPU of a commit.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial

from fireledger.definitions import NextFn, matched_fn, next_fn, plan_for_text, recurrence_of
from fireledger.domain.model import Decision, DueRow, NewFire, Policies
from fireledger.recurrence import CronRecurrence, Recurrence, UnionRecurrence, dst_label_us
from fireledger.store import Store, is_database_error

#: Trigger versions kept compiled between cycles (bounded: a million triggers must not all stay in
#: memory; a version evicted is read again in its batch's one statement).
VERSION_CACHE_MAX = 100_000


#: A version's DST labeller: the label of an instant (µs since the epoch) or None.
LabelFn = Callable[[int], str | None]


@dataclass(frozen=True, slots=True)
class Plan:
    """What planning needs of one trigger version."""

    policies: Policies
    next: NextFn
    label: LabelFn | None = None   # the DST labeller (cron versions only)
    #: A union's (decision 0155): the indexes of the specs an instant came from; None otherwise.
    matched: Callable[[int], tuple[int, ...]] | None = None
    #: The exclusion calendars the schedule names (decision 0156).
    calendars: tuple[str, ...] = ()


def label_fn(rec: Recurrence) -> LabelFn | None:
    """The DST labeller of a compiled recurrence: ``dst_label_us`` bound to it for a cron schedule
    (wall time) or a union with a cron spec, None for intervals and one-shots (absolute instants:
    never labelled)."""
    if isinstance(rec, UnionRecurrence):
        wall = any(isinstance(m, CronRecurrence) for m in rec.members)
        return partial(dst_label_us, rec) if wall else None
    return partial(dst_label_us, rec) if isinstance(rec, CronRecurrence) else None


def labelled(d: Decision, label: LabelFn) -> Decision:
    """``d`` with each fire carrying its instant's DST label (the same decision when none has one:
    most instants are not near a transition, and the labeller says so without a search)."""
    fires = d.fires
    out: list[NewFire] | None = None
    for i, f in enumerate(fires):
        lab = label(f.scheduled_us)
        if lab is not None:
            if out is None:
                out = list(fires)
            out[i] = replace(f, dst=lab)
    return d if out is None else replace(d, fires=tuple(out))


class VersionPlans:
    """The timing loop's cache of compiled versions (module docstring)."""

    def __init__(self, store: Store, limit: int = VERSION_CACHE_MAX) -> None:
        self.store = store
        self.limit = limit
        self.plans: dict[tuple[str, int], Plan] = {}
        self._older: dict[tuple[str, int], Policies] = {}   # policies of versions no row was due on

    def read_missing(self, rows: Sequence[DueRow]) -> dict[tuple[str, int], tuple[str, Policies]]:
        """What planning ``rows`` needs and the cache lacks, in one statement (empty when nothing is
        missing, or when a stored version does not decode: those are then read one by one by
        :meth:`plan_of`, each failing alone). Store failures propagate."""
        plans = self.plans
        missing = [(r.trigger_id, r.version) for r in rows if (r.trigger_id, r.version) not in plans]
        if not missing:
            return {}
        try:
            return self.store.timing.version_plans(missing)
        except Exception as exc:
            if is_database_error(exc):
                raise
            return {}

    def plan_of(self, trigger_id: str, version: int,
                read: dict[tuple[str, int], tuple[str, Policies]]) -> Plan | None:
        """The plan of a version: cached, else compiled from the batch's read (``read``) or read
        alone (None: the version is missing from the registry). Raises what compiling its schedule
        raises."""
        key = (trigger_id, version)
        p = self.plans.get(key)
        if p is not None:
            return p
        got = read.get(key)
        if got is not None:
            rec, fn = plan_for_text(trigger_id, version, got[0])
            p = Plan(got[1], fn, label_fn(rec), matched_fn(rec), rec.calendars)
        else:
            v = self.store.registry.get_version(trigger_id, version)
            if v is None:
                return None
            rec = recurrence_of(v)
            p = Plan(v.policies, next_fn(rec), label_fn(rec), matched_fn(rec), rec.calendars)
        if len(self.plans) >= self.limit:
            self.plans.clear()
        self.plans[key] = p
        return p

    def policies(self, trigger_id: str, version: int) -> Policies | None:
        """The policies of a version (cached with its plan, else read alone and kept: an overlap
        check's previous fire may be of an older version than any due row); None when missing."""
        key = (trigger_id, version)
        p = self.plans.get(key)
        if p is not None:
            return p.policies
        pol = self._older.get(key)
        if pol is None:
            v = self.store.registry.get_version(trigger_id, version)
            if v is None:
                return None
            if len(self._older) >= self.limit:
                self._older.clear()
            pol = self._older[key] = v.policies
        return pol


_GC_LOCK = threading.Lock()
_gc_holders = 0         # blocks inside gc_paused, in every thread
_gc_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cyclic garbage collector off for the block (decision 0136). Blocks in several
    threads share one pause: the first disables the collector (if it was enabled), the last to leave
    re-enables it — only if it was enabled before (an embedding application that disabled it keeps
    it so). Objects without cycles are freed by reference counting meanwhile; cyclic garbage made
    in the block is collected by the first collection after it. For bounded work only (one batch)."""
    global _gc_holders, _gc_was_enabled
    with _GC_LOCK:
        if _gc_holders == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_holders += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_was_enabled:
                gc.enable()


__all__ = ["VERSION_CACHE_MAX", "LabelFn", "Plan", "VersionPlans", "gc_paused", "label_fn", "labelled"]
