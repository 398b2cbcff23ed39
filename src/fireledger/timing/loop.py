"""The timing loop: claim due instants ≤ the clock's earliest bound, commit fires, advance rows.

``TimingLoop.tick()`` is one synchronous cycle (used directly by tests with a fake clock — the
manual scheduler); ``run()`` repeats it on the loop's own thread, which wakes once per cycle
(decision 0227), sleeping until the next due instant or until a definition changes (no fixed
polling tick; the sleep is capped so definition changes made by other processes are seen within
``max_sleep_s``). After a cycle that committed fires the next one starts no sooner than ``gather_s``
after that one was planned to start (decisions 0150, 0227): under a steady stream of instants one
cycle decides all those due meanwhile — one transaction, one hand-off — instead of one cycle each;
a fire is never claimed before its instant either way.

Order of effects is the product's central rule: fires are committed (with the due-row advance, in
one transaction) *before* ``on_committed`` hands them to dispatch. A cycle with more due than one
batch (a burst) hands each batch over as soon as it is committed, so dispatch starts on the first
thousand while the next are being committed (decision 0195) — those in batches of
:data:`FOLLOW_BATCH`, fewer and larger commits of the one SQLite writer (decision 0258); released
held fires follow the last.

**Partitions.** Without a lease manager the loop owns every partition (the embedded default: one
process). With one (:class:`fireledger.timing.leases.LeaseManager`, PostgreSQL) it reads only the due
rows of the partitions it holds, checks before planning *and* again right before each commit that
its ownership is still valid (dropping decisions of partitions released meanwhile), and commits
under the manager's ``claim_lock`` so a release never overlaps a commit of that partition. Nothing
else depends on the lease being exclusive: a decision committed late by a node that lost its lease
collides with the new owner's on the fire key (``ON CONFLICT DO NOTHING`` → zero rows) and its
due-row compare-and-set fails — no application code resolves the conflict.

**One bad row never stalls a partition** (decision 0087). A row that cannot be planned — its stored
schedule no longer compiles (a tzdata change, a corrupted row), its version is missing, its next
instant cannot be computed — is set aside: its due instant is recorded ``failed`` with a cause
naming the error, the trigger is paused with that reason (``pause_reason`` in the API) and the rest
of the batch is committed as usual. Store failures are not row failures: they abort the cycle, which
is retried.

**Clock evidence** (invariant 18): every fire records the ε of the clock reading it was decided
under and that reading's source (``eps_us``, ``eps_source``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fireledger.clock import Clock, Interval
from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import (
    ClaimOutcome,
    Decision,
    DueRow,
    FireKind,
    FireState,
    FireUpdate,
    Lane,
    NewFire,
    OverlapPolicy,
    Policies,
)
from fireledger.domain.overlap import HeldRef, PreviousFire, Verdict, apply_overlap, release_plan
from fireledger.domain.policies import PlanContext, miss_threshold_from, plan_due
from fireledger.domain.timing_records import FireFacts, HeldRow
from fireledger.observe.metrics import METRICS
from fireledger.recurrence import TZDATA_VERSION, RecurrenceError, format_instant
from fireledger.settings import process_env
from fireledger.store import Store, is_database_error
from fireledger.waker import Waker

from .exclusions import BatchCalendars, CalendarCache, annotate, calendars_for
from .leases import LeaseManager, Ownership
from .pace import HeldScan, gather_floor, sleep_after
from .plans import Plan, VersionPlans, gc_paused, labelled

log = logging.getLogger("fireledger.timing")

DEFAULT_EPS_CEILING_US = 100_000
#: Due rows per commit: the first of a cycle (dispatch starts on it), then each later one (0258).
FIRST_BATCH, FOLLOW_BATCH = 1000, 4000


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
    released: list[NewFire] = field(default_factory=list)   # held fires released (overlap queue)
    failed: list[NewFire] = field(default_factory=list)     # rows that could not be planned (paused)


def _by_trigger(row: DueRow) -> str:
    return row.trigger_id


@dataclass(frozen=True, slots=True)
class RowFailure:
    """A due row the loop could not plan, and why (decision 0087)."""

    row: DueRow
    cause: str


def is_store_failure(exc: BaseException) -> bool:
    """A failure of the store itself (not of one row's data): the cycle is aborted and retried."""
    return is_database_error(exc)


def failure_cause(exc: BaseException) -> str:
    """The recorded cause of a row that cannot be planned (never a payload: schedules and
    instants only)."""
    if isinstance(exc, RecurrenceError):
        return f"schedule no longer compiles: {exc.field}: {exc.problem}"
    text = " ".join(str(exc).split())[:200]
    return f"cannot plan this trigger: {type(exc).__name__}" + (f": {text}" if text else "")


class TimingLoop:
    def __init__(self, store: Store, clock: Clock, node_id: str, *, batch: int = FIRST_BATCH,
                 follow_batch: int = FOLLOW_BATCH,
                 eps_ceiling_us: int = DEFAULT_EPS_CEILING_US,
                 on_committed: Callable[[Sequence[NewFire]], None] = lambda fires: None,
                 max_sleep_s: float = 0.5, metrics: object | None = None,
                 leases: LeaseManager | None = None,
                 before_apply: Callable[[Sequence[Decision]], None] | None = None,
                 miss_threshold_us: int | None = None, gather_s: float = 0.0) -> None:
        """``batch``: the due rows the first commit of a cycle takes at most; ``follow_batch``: each
        later one of the same cycle (a burst: decision 0258; never below ``batch``).
        ``leases``: claim only the partitions this manager holds (None: all partitions).
        ``before_apply``: a test seam called with each batch after the last ownership check and
        right before its commit (the falsification suite pauses a node there). ``gather_s``: the
        least time from the start of a cycle that committed fires to the start of the next (0: none;
        the process passes ``Settings.pacing.timing_gather_s``)."""
        self.store = store
        self.leases = leases
        self.before_apply = before_apply
        # Lateness beyond which an instant is missed (FIRELEDGER_MISS_THRESHOLD_S, default 60 s: 0064).
        self.miss_threshold_us = miss_threshold_from(process_env()) if miss_threshold_us is None else miss_threshold_us
        self.clock = clock
        self.node_id = node_id
        self.batch = batch
        self.follow_batch = max(batch, follow_batch)
        self.eps_ceiling_us = eps_ceiling_us
        self.on_committed = on_committed
        self.max_sleep_s = max_sleep_s
        self.gather_s = gather_s
        self.plans = VersionPlans(store)    # compiled versions, kept between cycles
        self.calendars = CalendarCache(store)   # exclusion calendars, read per batch (decision 0157)
        self.held_scan = HeldScan()           # whether a cycle reads the held fires (decision 0229)
        self._wake = Waker()   # set: start the next cycle now (any thread); decision 0237
        self._stopping = False
        self.last: TickResult | None = None
        self.lateness_us: list[int] = []   # per inserted on-time fire: decided - scheduled
        self._last_failure = ""            # the last store failure logged by run() ("" after a good cycle)

    # --- one cycle -----------------------------------------------------------------------------

    def plan(self, rows: Sequence[DueRow], earliest_us: int, *, eps_us: int | None = None,
             eps_source: str | None = None) -> list[Decision]:
        """Decisions for ``rows``, in trigger-id order: every committer (another node deciding the
        same rows during a handover, a rebuild, a repartition) locks due rows in that order, so two
        commits never wait on each other in a cycle. Rows that cannot be planned are left out (see
        :meth:`plan_batch`)."""
        return self.plan_batch(rows, earliest_us, eps_us=eps_us, eps_source=eps_source)[0]

    def plan_batch(self, rows: Sequence[DueRow], earliest_us: int, *, eps_us: int | None = None,
                   eps_source: str | None = None) -> tuple[list[Decision], list[RowFailure]]:
        """:meth:`plan`, with the rows that could not be planned and why (each row isolated: one
        whose version is missing, whose schedule no longer compiles or whose next instant raises
        is a :class:`RowFailure`, the others are planned as usual). Store failures propagate."""
        ctx = PlanContext(earliest_us=earliest_us, decided_by=self.node_id, tzdata_version=TZDATA_VERSION,
                          miss_threshold_us=self.miss_threshold_us, eps_us=eps_us, eps_source=eps_source)
        cache = self.plans
        plans, read = cache.plans, cache.read_missing(rows)   # one statement for the uncached versions
        decisions: list[Decision] = []
        failures: list[RowFailure] = []
        checked: list[tuple[int, DueRow, Policies]] = []   # overlap skip/queue with a fire to dispatch
        cals: BatchCalendars = {}   # this batch's calendar reads (decision 0156), made on first need
        allow = OverlapPolicy.ALLOW
        for row in sorted(rows, key=_by_trigger):
            try:
                p = plans.get((row.trigger_id, row.version)) or cache.plan_of(row.trigger_id, row.version, read)
                if p is None:
                    failures.append(RowFailure(row, f"cannot plan this trigger: definition version {row.version} "
                                                    "is missing from the registry"))
                    continue
                d = plan_due(row, p.next, p.policies, ctx)
                if p.label is not None:
                    d = labelled(d, p.label)
                if p.matched is not None or p.calendars:
                    d = self._annotate(d, row, p, cals)
            except Exception as exc:
                if is_store_failure(exc):
                    raise
                failures.append(RowFailure(row, failure_cause(exc)))
                continue
            if p.policies.overlap != allow and any(f.state == FireState.PENDING for f in d.fires):
                checked.append((len(decisions), row, p.policies))
            decisions.append(d)
        if checked:
            self._apply_overlap(decisions, checked, earliest_us)
        return decisions, failures

    def _annotate(self, d: Decision, row: DueRow, p: Plan, cals: BatchCalendars) -> Decision:
        """Matched specs recorded and calendar exclusions applied (:mod:`.exclusions`); the calendars
        are read once per batch for each tenant and set of names (read at every batch: a change is
        seen by the next decision, decision 0157)."""
        if not p.calendars:
            return annotate(d, p.matched, ())
        key = (row.tenant_id, p.calendars)
        read = cals.get(key)
        if read is None:
            read = cals[key] = self.calendars.read([(row.tenant_id, n) for n in p.calendars])
        return annotate(d, p.matched, calendars_for(row.tenant_id, p.calendars, read))

    def fail_rows(self, failures: Sequence[RowFailure], earliest_us: int, eps_us: int | None,
                  eps_source: str | None) -> list[NewFire]:
        """Record each failure's due instant ``failed`` with its cause and pause its trigger with
        the reason (one transaction per row); returns the failed fires recorded. A row that moved
        meanwhile (amended, paused, decided elsewhere) is left alone."""
        out: list[NewFire] = []
        when = format_instant(from_us(earliest_us))
        for fl in failures:
            r = fl.row
            fire = NewFire(r.tenant_id, r.trigger_id, r.next_us, 0, r.version, FireKind.SCHEDULED, Lane.ON_TIME,
                           FireState.FAILED, earliest_us, TZDATA_VERSION, self.node_id, fl.cause,
                           eps_us=eps_us, eps_source=eps_source)
            reason = (f"paused by the timing plane at {when}: {fl.cause}; amend the trigger (a new schedule) "
                      "and resume it")
            if self.store.registry.pause_failing(r, fire, reason, earliest_us):
                out.append(fire)
                log.warning("trigger %s paused: its instant %s cannot be decided (%s)", r.trigger_id,
                            format_instant(from_us(r.next_us)), fl.cause)
        return out

    # --- overlap (decision 0060) ---------------------------------------------------------------

    def _previous(self, facts: FireFacts | None) -> PreviousFire | None:
        """The overlap check's view of a previous fire: its window is its own version's."""
        if facts is None:
            return None
        pol = self.plans.policies(facts.trigger_id, facts.version)
        window_s = (pol if pol is not None else Policies()).outcome_window_s
        key = str(FireKey(facts.tenant_id, facts.trigger_id, facts.scheduled_us, facts.seq))
        return PreviousFire(key, FireState(facts.state), facts.dispatched_us, facts.has_outcome, window_s)

    def _apply_overlap(self, decisions: list[Decision], checked: Sequence[tuple[int, DueRow, Policies]],
                       at_us: int) -> None:
        """Apply overlap skip/queue to the decisions at ``checked`` (in place), reading the previous
        and held fires of those triggers in one statement. Rows under ``allow`` never get here."""
        facts = self.store.timing.overlap_facts([(r.tenant_id, r.trigger_id) for _, r, _ in checked])
        for i, r, pol in checked:
            fx = facts.get(r.trigger_id)
            prev = self._previous(fx.previous if fx is not None else None)
            h = fx.held if fx is not None else None
            held = None if h is None else HeldRef(h.tenant_id, h.trigger_id, h.scheduled_us, h.seq)
            decisions[i] = apply_overlap(decisions[i], prev, held, pol.overlap, pol.outcome_window_s, at_us)

    def release_held(self, at_us: int, own: Ownership | None, page: int = 1000) -> list[NewFire]:
        """Re-evaluate held fires (of the partitions held) and release each whose previous fire has
        finished, one transaction per page of held fires; returns the released fires (now pending)."""
        out: list[NewFire] = []
        after: tuple[int, str, int] | None = None
        found = 0   # held fires of the partitions held, released or not
        while True:
            rows = self.store.timing.held_fires(after, page)
            if rows:
                last = rows[-1]
                after = (last.scheduled_us, last.trigger_id, last.seq)
                mine = rows if own is None else [h for h in rows if own.owns(h.partition)]
                found += len(mine)
                out += self._release_page(mine, at_us)
            if len(rows) < page:
                self.held_scan.read(self.clock.monotonic(), None if own is None else own.partitions,
                                    found > len(out))
                return out

    def _release_page(self, rows: Sequence[HeldRow], at_us: int) -> list[NewFire]:
        if not rows:
            return []
        facts = self.store.timing.overlap_facts([(h.tenant_id, h.trigger_id) for h in rows])
        chosen: list[tuple[HeldRow, FireUpdate, NewFire]] = []
        for h in rows:
            cur = self.plans.policies(h.trigger_id, h.current_version)
            policy = cur.overlap if cur is not None else OverlapPolicy.QUEUE
            fx = facts.get(h.trigger_id)
            plan = release_plan(self._previous(fx.previous if fx is not None else None), policy, at_us)
            if plan.verdict == Verdict.HOLD:
                continue
            cause = plan.cause or "overlap: released from hold"
            chosen.append((h, FireUpdate(h.tenant_id, h.trigger_id, h.scheduled_us, h.seq, FireState.HELD,
                                         FireState.PENDING, cause, at_us),
                           NewFire(h.tenant_id, h.trigger_id, h.scheduled_us, h.seq, h.version, FireKind(h.kind),
                                   Lane(h.lane), FireState.PENDING, at_us, h.tzdata_version, self.node_id, cause)))
        if not chosen:
            return []
        # Trigger-id order, as decisions lock (and supersede held fires): two commits never wait in a cycle.
        chosen.sort(key=lambda c: c[0].trigger_id)
        if self.leases is None:
            done = self.store.timing.release_held([u for _, u, _ in chosen])
        else:
            with self.leases.claim_lock:   # as a commit of decisions: ownership re-checked, no release overlaps
                own = self.leases.ownership()
                if not own.valid(self.clock.monotonic()):
                    return []
                chosen = [c for c in chosen if own.owns(c[0].partition)]
                done = self.store.timing.release_held([u for _, u, _ in chosen])
        out = [f for (_, _, f), ok in zip(chosen, done, strict=True) if ok]
        for f in out:
            log.info("overlap: released held fire %s", FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))
        return out

    def ownership(self) -> Ownership | None:
        """What this loop may claim now (None: every partition)."""
        return None if self.leases is None else self.leases.ownership()

    def _due(self, until_us: int, own: Ownership | None, limit: int) -> list[DueRow]:
        if own is None:
            return self.store.timing.due_rows(until_us, limit)
        return self.store.timing.due_rows_in(until_us, limit, sorted(own.partitions), own.n)

    def _commit_batch(self, rows: Sequence[DueRow], iv: Interval, res: TickResult) -> list[ClaimOutcome] | None:
        """Plan ``rows`` and commit the decisions (the commit point); rows that cannot be planned are
        recorded failed. With leases, ownership is checked again right before the commit, under the
        manager's claim lock, and decisions of partitions released meanwhile are dropped; None when
        ownership ran out (nothing committed)."""
        decisions, failures = self.plan_batch(rows, iv.earliest_us, eps_us=iv.eps_us, eps_source=iv.source)
        if self.leases is None:
            if self.before_apply is not None:
                self.before_apply(decisions)
            outcomes = self.store.timing.apply_decisions(decisions)   # commit point
            if failures:
                res.failed += self.fail_rows(failures, iv.earliest_us, iv.eps_us, iv.source)
            return outcomes
        part = {r.trigger_id: r.partition for r in rows}
        with self.leases.claim_lock:
            cur = self.leases.ownership()
            if not cur.valid(self.clock.monotonic()):
                res.lease_lost = True
                log.info("node %s: ownership ran out before a commit; %d decisions dropped",
                         self.node_id, len(decisions))
                return None
            kept = [d for d in decisions if cur.owns(part[d.advance.trigger_id])]
            res.dropped += len(decisions) - len(kept)
            if self.before_apply is not None:
                self.before_apply(kept)
            outcomes = self.store.timing.apply_decisions(kept)   # commit point
            mine = [fl for fl in failures if cur.owns(part[fl.row.trigger_id])]
            if mine:
                res.failed += self.fail_rows(mine, iv.earliest_us, iv.eps_us, iv.source)
        return outcomes

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
        # Held fires first: one released now is the previous fire of an instant decided below.
        parts, mono = (None if own is None else own.partitions), self.clock.monotonic()
        if self.held_scan.due(mono, parts):
            res.released = self.release_held(iv.earliest_us, own)
        limit = self.batch   # the first commit small, so dispatch starts on it; the rest in bulk (0258)
        while True:
            with gc_paused():   # one batch's short-lived objects, freed by reference counting (0136)
                rows = self._due(iv.earliest_us, own, limit)
                if not rows:
                    break
                outcomes = self._commit_batch(rows, iv, res)
            if outcomes is None:
                break
            res.claimed_rows += len(rows)
            committed: list[NewFire] = []
            for o in outcomes:
                if not o.advanced:
                    res.lost += 1
                res.inserted.extend(o.inserted)
                if any(f.state is FireState.HELD for f in o.inserted):
                    self.held_scan.committed_held()
                committed.extend(f for f in o.inserted if f.state == FireState.PENDING)
            if committed:
                self.on_committed(committed)   # this batch only after its commit (decision 0195)
            if len(rows) < limit or res.dropped:
                break
            limit = self.follow_batch
        pending = [f for f in res.inserted if f.state == FireState.PENDING]
        for (lane, state), count in Counter((f.lane, f.state) for f in [*res.inserted, *res.failed]).items():
            METRICS.fires.labels(lane.value, state.value).inc(count)
        observe = METRICS.lateness.observe
        for f in pending:
            late_us = f.decided_us - f.scheduled_us
            self.lateness_us.append(late_us)
            if f.lane is Lane.ON_TIME:
                observe(late_us / 1e6)
        if len(self.lateness_us) > 100_000:
            del self.lateness_us[:50_000]
        if res.released:
            self.on_committed(res.released)   # only after commit
        self.last = res
        return res

    # --- the async loop ------------------------------------------------------------------------

    def _cycle(self) -> tuple[TickResult, int | None]:
        """One cycle and, unless it shed, the next due instant: one hop to the store thread."""
        res = self.tick()
        return res, (None if res.shed else self._earliest_due())

    def _earliest_due(self) -> int | None:
        own = self.ownership()
        if own is None:
            return self.store.timing.earliest_due()
        if not own.partitions:
            return None
        return self.store.timing.earliest_due_in(sorted(own.partitions), own.n)

    def wake_threadsafe(self) -> None:
        """Wake the loop from another thread (a lease taken, a definition-change notification)."""
        self._wake.set()

    def wake(self) -> None:
        """Definitions changed in this process: re-read the due index now."""
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    def _failed_cycle(self, exc: Exception) -> float:
        """Log a failed cycle and return the pause before the next. A store failure (a lost
        connection, a failover in progress) is an ordinary event: one warning per distinct message,
        retried after 0.5 s, so fires are decided again within half a second of the store's return;
        anything else is logged with its traceback and retried after 1 s."""
        if not is_store_failure(exc):
            log.exception("timing cycle failed; retrying")
            return 1.0
        msg = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if msg != self._last_failure:
            log.warning("timing cycle failed, the store is unavailable (retrying every 0.5 s): %s", msg)
        self._last_failure = msg
        return 0.5

    async def run(self) -> None:
        """Run cycles until :meth:`stop`, on this loop's own thread (``timing-store``; decision 0227):
        the thread sleeps between cycles and wakes once per cycle — no hop through the event loop
        and back per cycle. Returns when the thread has finished its last cycle (also when this
        task is cancelled: the thread is stopped and waited for)."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="timing-store")
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._run_cycles)
        finally:
            self._stopping = True
            self._wake.set()
            executor.shutdown(wait=True)

    def _run_cycles(self) -> None:
        """The cycles and the sleeps between them (the ``timing-store`` thread). After a cycle that
        committed fires the next starts no sooner than ``gather_s`` after the *planned* start of
        that one (:func:`gather_floor`), so a late wake-up is not carried into the next window."""
        planned = time.monotonic()
        while not self._stopping:
            self._wake.clear()
            started = time.monotonic()
            try:
                res, nxt = self._cycle()
                self._last_failure = ""
                if res.shed:
                    delay = 1.0
                else:
                    delay = sleep_after(res, nxt, self.clock.now().earliest_us, self.max_sleep_s)
                    if res.claimed_rows and self.gather_s > 0:   # drained what was due: gather the next
                        delay = max(delay, gather_floor(started, planned, self.gather_s) - time.monotonic())
            except Exception as exc:
                delay = self._failed_cycle(exc)
            planned = time.monotonic() + max(delay, 0.0)
            if delay > 0 and self._wake.wait(delay):
                planned = time.monotonic()   # woken early (a definition change, a lease, stop)
