"""The timing loop: claim due instants ≤ the clock's earliest bound, commit fires, advance rows.

``TimingLoop.tick()`` is one synchronous cycle (used directly by tests with a fake clock — the
manual scheduler); ``run()`` repeats it on an asyncio loop, sleeping until the next due instant or
until a definition changes (no fixed polling tick; the sleep is capped so definition changes made
by other processes are seen within ``max_sleep_s``).

Order of effects is the product's central rule: fires are committed (with the due-row advance, in
one transaction) *before* ``on_committed`` hands them to dispatch.

**Partitions.** Without a lease manager the loop owns every partition (the embedded default: one
process). With one (:class:`fireledger.timing.leases.LeaseManager`, PostgreSQL) it reads only the due
rows of the partitions it holds, checks before planning *and* again right before each commit that
its ownership is still valid (dropping decisions of partitions released meanwhile), and commits
under the manager's ``claim_lock`` so a release never overlaps a commit of that partition. Nothing
else depends on the lease being exclusive: a decision committed late by a node that lost its lease
collides with the new owner's on the fire key (``ON CONFLICT DO NOTHING`` → zero rows) and its
due-row compare-and-set fails — no application code resolves the conflict.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from fireledger.clock import Clock
from fireledger.definitions import next_us, recurrence_of
from fireledger.domain.model import Decision, DueRow, FireState, NewFire, TriggerVersion
from fireledger.domain.policies import PlanContext, plan_due
from fireledger.observe.metrics import METRICS
from fireledger.recurrence import TZDATA_VERSION
from fireledger.store import SqlStore

from .leases import LeaseManager, Ownership

log = logging.getLogger("fireledger.timing")

DEFAULT_EPS_CEILING_US = 100_000


@dataclass
class TickResult:
    """What one cycle did. ``shed`` is set when the clock bound was too wide to claim anything."""

    claimed_rows: int = 0
    inserted: list[NewFire] = field(default_factory=list)
    lost: int = 0                 # CAS found the row moved: decided elsewhere (normal)
    shed: str | None = None
    earliest_us: int = 0
    eps_us: int = 0
    partitions: int | None = None   # partitions held this cycle (None: every partition)
    lease_lost: bool = False      # ownership ran out or moved before a commit: the batch was dropped
    dropped: int = 0              # decisions dropped for partitions released before the commit


class TimingLoop:
    def __init__(self, store: SqlStore, clock: Clock, node_id: str, *, batch: int = 1000,
                 eps_ceiling_us: int = DEFAULT_EPS_CEILING_US,
                 on_committed: Callable[[Sequence[NewFire]], None] = lambda fires: None,
                 max_sleep_s: float = 0.5, metrics: object | None = None,
                 leases: LeaseManager | None = None,
                 before_apply: Callable[[Sequence[Decision]], None] | None = None) -> None:
        """``leases``: claim only the partitions this manager holds (None: all partitions).
        ``before_apply``: a test seam called with each batch after the last ownership check and
        right before its commit (the falsification suite pauses a node there)."""
        self.store = store
        self.leases = leases
        self.before_apply = before_apply
        self.clock = clock
        self.node_id = node_id
        self.batch = batch
        self.eps_ceiling_us = eps_ceiling_us
        self.on_committed = on_committed
        self.max_sleep_s = max_sleep_s
        self._versions: dict[tuple[str, int], TriggerVersion] = {}
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.last: TickResult | None = None
        self.lateness_us: list[int] = []   # per inserted on-time fire: decided - scheduled

    # --- one cycle -----------------------------------------------------------------------------

    def _version(self, trigger_id: str, version: int) -> TriggerVersion | None:
        key = (trigger_id, version)
        v = self._versions.get(key)
        if v is None:
            v = self.store.get_version(trigger_id, version)
            if v is not None:
                if len(self._versions) > 1_000_000:
                    self._versions.clear()
                self._versions[key] = v
        return v

    def plan(self, rows: Sequence[DueRow], earliest_us: int) -> list[Decision]:
        """Decisions for ``rows``, in trigger-id order: every committer (another node deciding the
        same rows during a handover, a rebuild, a repartition) locks due rows in that order, so two
        commits never wait on each other in a cycle."""
        ctx = PlanContext(earliest_us=earliest_us, decided_by=self.node_id, tzdata_version=TZDATA_VERSION)
        decisions = []
        for row in sorted(rows, key=lambda r: r.trigger_id):
            v = self._version(row.trigger_id, row.version)
            if v is None:
                continue
            rec = recurrence_of(v)
            decisions.append(plan_due(row, partial(next_us, rec), v.policies, ctx))
        return decisions

    def ownership(self) -> Ownership | None:
        """What this loop may claim now (None: every partition)."""
        return None if self.leases is None else self.leases.ownership()

    def _due(self, until_us: int, own: Ownership | None) -> list[DueRow]:
        if own is None:
            return self.store.due_rows(until_us, self.batch)
        return self.store.due_rows_in(until_us, self.batch, sorted(own.partitions), own.n)

    def tick(self) -> TickResult:
        """One cycle: read the clock, claim every due row ≤ earliest of the partitions held (in
        batches), commit."""
        iv = self.clock.now()
        res = TickResult(earliest_us=iv.earliest_us, eps_us=iv.eps_us)
        METRICS.eps.labels(self.node_id, iv.source).set(iv.eps_us / 1e6)
        METRICS.shedding.labels(self.node_id).set(1 if iv.eps_us > self.eps_ceiling_us else 0)
        if iv.eps_us > self.eps_ceiling_us:
            res.shed = (f"clock uncertainty {iv.eps_us / 1000:.1f} ms exceeds the ceiling "
                        f"{self.eps_ceiling_us / 1000:.1f} ms ({iv.source}); claiming nothing")
            log.warning(res.shed)
            self.last = res
            return res
        own = self.ownership()
        if own is not None:
            res.partitions = len(own.partitions)
            if not own.valid(self.clock.monotonic()):
                self.last = res
                return res
        while True:
            rows = self._due(iv.earliest_us, own)
            if not rows:
                break
            decisions = self.plan(rows, iv.earliest_us)
            if self.leases is None:
                if self.before_apply is not None:
                    self.before_apply(decisions)
                outcomes = self.store.apply_decisions(decisions)   # commit point
            else:
                part = {r.trigger_id: r.partition for r in rows}
                with self.leases.claim_lock:
                    cur = self.leases.ownership()
                    if not cur.valid(self.clock.monotonic()):
                        res.lease_lost = True
                        log.info("node %s: ownership ran out before a commit; %d decisions dropped",
                                 self.node_id, len(decisions))
                        break
                    kept = [d for d in decisions if cur.owns(part[d.advance.trigger_id])]
                    res.dropped += len(decisions) - len(kept)
                    if self.before_apply is not None:
                        self.before_apply(kept)
                    outcomes = self.store.apply_decisions(kept)   # commit point
            res.claimed_rows += len(rows)
            for o in outcomes:
                if not o.advanced:
                    res.lost += 1
                res.inserted.extend(o.inserted)
            if len(rows) < self.batch or res.dropped:
                break
        pending = [f for f in res.inserted if f.state == FireState.PENDING]
        for f in res.inserted:
            METRICS.fires.labels(f.lane.value, f.state.value).inc()
        for f in pending:
            self.lateness_us.append(f.decided_us - f.scheduled_us)
            if f.lane.value == "on-time":
                METRICS.lateness.observe((f.decided_us - f.scheduled_us) / 1e6)
        if len(self.lateness_us) > 100_000:
            del self.lateness_us[:50_000]
        if pending:
            self.on_committed(pending)   # only after commit
        self.last = res
        return res

    # --- the async loop ------------------------------------------------------------------------

    def _earliest_due(self) -> int | None:
        own = self.ownership()
        if own is None:
            return self.store.earliest_due()
        if not own.partitions:
            return None
        return self.store.earliest_due_in(sorted(own.partitions), own.n)

    def wake_threadsafe(self) -> None:
        """Wake the loop from another thread (a lease taken, a definition-change notification)."""
        loop, ev = self._loop, self._wake
        if loop is not None and ev is not None:
            loop.call_soon_threadsafe(ev.set)

    def wake(self) -> None:
        """Definitions changed in this process: re-read the due index now."""
        if self._wake is not None:
            self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    async def run(self) -> None:
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._loop = loop
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="timing-store")
        try:
            while not self._stopping:
                self._wake.clear()
                try:
                    res = await loop.run_in_executor(executor, self.tick)
                    if res.shed:
                        delay = 1.0
                    else:
                        nxt = await loop.run_in_executor(executor, self._earliest_due)
                        iv = self.clock.now()
                        delay = self.max_sleep_s if nxt is None else (nxt - iv.earliest_us) / 1e6
                        delay = max(0.0, min(delay, self.max_sleep_s))
                        if delay == 0.0 and res.claimed_rows == 0:
                            # Something is due that this cycle could not claim (ownership ran out,
                            # a batch dropped): do not spin; the lease manager wakes us on a grant.
                            delay = min(0.05, self.max_sleep_s)
                except Exception:
                    log.exception("timing cycle failed; retrying")
                    delay = 1.0
                if delay > 0:
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=delay)
                    except TimeoutError:
                        pass
        finally:
            executor.shutdown(wait=True)
