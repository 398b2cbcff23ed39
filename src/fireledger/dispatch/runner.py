"""The attempt runner: claims committed fires from the ledger through the lanes and makes one attempt
each — an HTTP POST, a put on a tenant's queue, or a call of a registered Python callable.

Only committed fires can be claimed (the ledger *is* the queue), so nothing is ever sent for a fire
whose record did not commit. Each claim round is one store transaction (``claim_shaped``) in which
:mod:`fireledger.dispatch.shaping` decides what starts now: lanes with their own rates and
concurrency, per-tenant quotas (fires/s and in flight), recovery lanes paced at a fraction of the
tenant's quota, and the published shedding order (backfill, catch-up, over-quota, on-time). A claim
leases the fire until the attempt's deadline plus a margin; a runner killed mid-attempt leaves the
lease to expire and another runner (or this one restarted) picks the fire up as a further attempt
under the same key. Outcomes and what each settles to: :mod:`fireledger.dispatch.settling`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from prometheus_client import Gauge

from fireledger.clock import Clock
from fireledger.domain.dispatch_records import ClaimResult, Settlement
from fireledger.observe.metrics import METRICS
from fireledger.security.egress import EgressPolicy
from fireledger.settings import Settings
from fireledger.store import Store

from . import shaping
from .attempts import Attempts
from .credentials import KeyRingFile
from .held import FlowGate
from .http import HttpSender
from .internal import REGISTRY, InternalRegistry, load_modules
from .lanes import LANES, DispatchConfig
from .settling import _Shaper, decode_payload, dispatch_body, settle, settle_on_error

__all__ = ["Dispatcher", "decode_payload", "dispatch_body", "settle", "settle_on_error"]

log = logging.getLogger("fireledger.dispatch")

LEASE_MARGIN_US = 5_000_000
#: The longest pause between two tries to record attempt results the store refused (growing 0.25 s a try).
FLUSH_RETRY_MAX_S = 1.0
DEFAULT_LEASE_US = 30_000_000 + LEASE_MARGIN_US

WAITING = Gauge("fireledger_dispatch_waiting", "Due fires offered but left waiting at the last claim round, "
                "by class (what is being shed)", ["node", "admission"], registry=METRICS.registry)


class Dispatcher(Attempts):
    """Drains the lanes of the ledger (see the module docstring).

    ``lanes`` limits which lanes this process serves; ``concurrency`` and ``batch`` override the
    config's; ``internal`` is the registry of ``internal`` targets (the process-wide one by default).
    """

    def __init__(self, store: Store, clock: Clock, node_id: str, *,
                 lanes: tuple[str, ...] = LANES, concurrency: int | None = None, batch: int | None = None,
                 idle_s: float = 0.5, sender: HttpSender | None = None, keys: KeyRingFile | None = None,
                 issuer: str = "http://127.0.0.1:8080", config: DispatchConfig | None = None,
                 internal: InternalRegistry | None = None, egress: EgressPolicy | None = None,
                 settle_gather_s: float = 0.0) -> None:
        cfg = config or DispatchConfig()
        if concurrency is not None:
            cfg = replace(cfg, concurrency=concurrency)
        if batch is not None:
            cfg = replace(cfg, batch=batch)
        unknown = [lane for lane in lanes if lane not in LANES]
        if unknown:
            raise ValueError(f"lanes: unknown lane {unknown[0]!r}")
        self.store = store
        self.clock = clock
        self.node_id = node_id
        self.lanes = lanes
        self.config = cfg
        self.concurrency = cfg.concurrency
        self.batch = cfg.batch
        self.idle_s = idle_s
        self.settle_gather_s = settle_gather_s   # least time between the starts of two recordings (0152)
        self.sender, self.keys, self.issuer = sender, keys, issuer
        self.internal = internal if internal is not None else REGISTRY
        self.egress = egress   # the sender's egress policy (None: from the environment, see HttpSender)
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._results: list[Settlement] = []
        self._flush_event: asyncio.Event | None = None
        self.delivered = 0
        self._inflight = self._over_inflight = 0
        self._lane_inflight: Counter[str] = Counter()
        self._min_claim = max(1, cfg.concurrency // 8)
        self._left = True   # the last claim round left due work unclaimed (full window, held back): 0151
        self.admitted: Counter[str] = Counter()   # by service class, since start
        self.last_waiting: dict[str, int] = {}
        self.drain_s = 5.0   # how long run() waits, once stopped, for attempts in flight and their recording
        self._claiming: asyncio.Future[tuple[list[bool], ClaimResult]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()   # attempts started and not yet finished
        # HTTP attempts per flow (tenant, origin, path; decision 0133): started and not finished, and
        # claimed but held back first come first served until the flow's adaptive limit has room (0242).
        self._gate = FlowGate()
        self._running = False
        self._drained = False   # run() is stopping and its attempts are over: the flusher may end
        self._step_executor: ThreadPoolExecutor | None = None   # the stepping API's store thread
        self._own_step_sender = False

    @classmethod
    def from_env(cls, store: Store, clock: Clock, node_id: str, **kw: Any) -> Dispatcher:
        """:meth:`from_settings` with the settings read from the environment now."""
        return cls.from_settings(store, clock, node_id, Settings.from_env(), **kw)

    @classmethod
    def from_settings(cls, store: Store, clock: Clock, node_id: str, settings: Settings, **kw: Any) -> Dispatcher:
        """A dispatcher configured by ``settings`` (lanes, concurrency: :mod:`fireledger.dispatch.lanes`),
        after importing the modules in ``FIRELEDGER_INTERNAL_MODULES`` (they register internal targets)."""
        load_modules(settings.internal_modules)
        kw.setdefault("egress", EgressPolicy(allow_private=settings.allow_private_targets))
        kw.setdefault("idle_s", settings.pacing.dispatch_idle_s)   # FIRELEDGER_DISPATCH_IDLE_S (decision 0150)
        kw.setdefault("settle_gather_s", settings.pacing.dispatch_settle_gather_s)   # decision 0152
        return cls(store, clock, node_id, config=DispatchConfig.from_settings(settings), **kw)

    def wake(self) -> None:
        """Fires were committed in this process: claim now instead of at the next idle poll."""
        if self._wake is not None:
            self._wake.set()

    def wake_threadsafe(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.call_soon_threadsafe(self.wake)

    def stop(self, drain_s: float | None = None) -> None:
        """Stop claiming; :meth:`run` then waits at most ``drain_s`` (default :attr:`drain_s`) for
        the attempts in flight and the recording of their results, cancels what is left (those
        fires' leases lapse and they are attempted again under the same key) and returns."""
        if drain_s is not None:
            self.drain_s = drain_s
        self._stopping = True
        if self._claiming is not None:
            self._claiming.cancel()   # a claim round still in the store: stop waiting for it
        self.wake()

    # --- capacity -------------------------------------------------------------------------------

    def capacity(self) -> shaping.Capacity:
        """This process's free attempt slots now."""
        cfg = self.config
        lanes = {lane: (cfg.lane(lane).concurrency - self._lane_inflight[lane]) if lane in self.lanes else 0
                 for lane in LANES}
        return shaping.Capacity(cfg.concurrency - self._inflight, lanes, cfg.over_quota_slots - self._over_inflight)

    def _fetch(self, cap: shaping.Capacity) -> dict[str, int]:
        out = {}
        for lane in self.lanes:
            free = min(cap.total, cap.lanes.get(lane, 0), self.batch)
            if free > 0:
                out[lane] = 2 * free + 16   # room for candidates held back by a quota
        return out

    async def _flusher(self, loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor) -> None:
        """Record attempt results in batches until stopped and nothing is left to record. A batch
        the store refuses as a whole (it is down) is kept and tried again; an item the store cannot
        record is set aside by the store with a cause (``settle_dispatch``), so one fire never holds
        back the others. Stopping does not wait for a store that never answers: :meth:`run`
        abandons this task at its drain deadline."""
        assert self._flush_event is not None
        failures, last = 0, -math.inf
        while True:
            if not self._results:
                if self._stopping and self._drained:
                    return   # (not before: attempts finishing during the drain are recorded too)
                await self._flush_event.wait()
                self._flush_event.clear()
                continue
            if (claiming := self._claiming) is not None and not self._stopping:
                # A claim round is in the store: the loop's next round takes these results into its
                # transaction (decision 0233); what it leaves (no round follows) is recorded here.
                await asyncio.wait({claiming})
                await asyncio.sleep(0)
                continue
            if (pause := self.settle_gather_s - (loop.time() - last)) > 0 and not self._stopping:
                # Results finishing meanwhile share the transaction (0152), and a claim round starting
                # meanwhile takes them all into its own (0233, decision 0253): look again after it.
                await asyncio.sleep(pause)
                last = loop.time() - self.settle_gather_s   # the window is over: no second pause
                continue
            batch, self._results, last = self._results, [], loop.time()
            try:
                await self._record(loop, executor, batch)
                failures = 0
            except Exception as exc:
                failures += 1
                log.error("recording %d attempt results failed (%s); will retry", len(batch), type(exc).__name__)
                self._results[:0] = batch
                # Unrecorded, these fires hold their tenant's in-flight quota: retry within 1 s.
                await asyncio.sleep(min(FLUSH_RETRY_MAX_S, 0.25 * failures))

    async def _record(self, loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor,
                      batch: list[Settlement]) -> int:
        """Record one batch of attempt results in one store call (``settle_dispatch``) and return how
        many the store recorded; raises, recording nothing, when the store refuses the batch as a whole."""
        oks = await loop.run_in_executor(executor, self.store.dispatch.settle_dispatch, batch,
                                         self.clock.now().latest_us)
        self.delivered += sum(1 for s, ok in zip(batch, oks, strict=True) if ok and s.state == "delivered")
        if self._left or any(s.state == "pending" for s in batch):
            self.wake()   # a retry to schedule, or in-flight quota freed for work left waiting
        return sum(1 for ok in oks if ok)

    # --- the loop -------------------------------------------------------------------------------

    def _claim(self, cap: shaping.Capacity, fetch: dict[str, int],
               batch: list[Settlement]) -> tuple[list[bool], ClaimResult]:
        now_us = self.clock.now().latest_us
        shaper = _Shaper(self.config, cap)
        if batch:   # the results finished since the last round, in the claim's transaction (decision 0233)
            return self.store.dispatch.settle_and_claim(batch, now_us, self.node_id, fetch, shaper, LEASE_MARGIN_US)
        return [], self.store.dispatch.claim_shaped(now_us, self.node_id, fetch, shaper, LEASE_MARGIN_US)

    async def _claim_round(self, loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor,
                           cap: shaping.Capacity, fetch: dict[str, int], fold: bool = False) -> ClaimResult | None:
        """One claim transaction at the clock's current reading, in ``executor``; ``None`` when
        :meth:`stop` abandoned it while it was still in the store. Raises what the store raised.
        ``fold``: the attempt results waiting to be recorded go in the same transaction, recorded
        before the claim reads (``settle_and_claim``, decision 0233); when it raises or is abandoned
        they are kept for the flusher (whose call runs after this one in the store thread)."""
        started = loop.time()
        batch: list[Settlement] = []
        if fold:
            batch, self._results = self._results, []
        claiming = self._claiming = loop.run_in_executor(executor, self._claim, cap, fetch, batch)
        try:
            oks, res = await claiming
        except BaseException:
            if batch:
                self._results[:0] = batch
                if self._flush_event is not None:
                    self._flush_event.set()
            if self._stopping and claiming.cancelled():
                return None   # stop() does not wait for a claim stuck in the store
            raise
        finally:
            self._claiming = None
        if batch:
            self.delivered += sum(1 for st, ok in zip(batch, oks, strict=True) if ok and st.state == "delivered")
        if log.isEnabledFor(logging.DEBUG):
            log.debug("claim round: %d started, %d waiting, %.1f ms", len(res.jobs),
                      sum(res.waiting.values()), (loop.time() - started) * 1000)
        return res

    def _take(self, res: ClaimResult) -> None:
        """Start the attempts a claim round admitted and publish what it left waiting."""
        for claimed in res.jobs:
            self._start(claimed)
        self.last_waiting = dict(res.waiting)
        for name in ("on-time", "over-quota", "catch-up", "backfill"):
            WAITING.labels(self.node_id, name).set(res.waiting.get(name, 0))

    # --- stepping (tests and tools drive the dispatcher like TimingLoop.tick()) ------------------

    def _new_sender(self) -> HttpSender:
        """The process's HTTP sender: ``concurrency`` connections, per origin an adaptive limit of at
        most 64 (decision 0116), the connect timeout of the config (decision 0117)."""
        return HttpSender(limit=self.concurrency, limit_per_host=min(self.concurrency, 64), egress=self.egress,
                          connect_timeout_s=self.config.connect_timeout_s)

    def _stepping(self) -> ThreadPoolExecutor:
        if self._running:
            raise RuntimeError("the stepping API cannot be used while run() is running")
        if self.sender is None:
            self.sender = self._new_sender()
            self._own_step_sender = True
        if self._step_executor is None:
            self._step_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dispatch-step")
        return self._step_executor

    async def claim_once(self) -> int:
        """Make one claim round at the clock's current reading and start the attempts it admits;
        return how many were started.

        The round is the one :meth:`run` makes (same shaping, capacity, quotas and leases), but only
        one: where ``run()`` claims again at once after a full window, call this again. With a fake
        clock only fires due at its reading are claimed — a retry once the clock has reached its
        ``next_attempt_us``, never before. The attempts run as tasks on the current loop;
        :meth:`flush` waits for them and records their results. Nothing is retried here: an error
        of the store propagates and nothing is started. Not usable while :meth:`run` is running;
        release the HTTP session and store thread with :meth:`aclose` (or ``async with``).
        """
        executor = self._stepping()
        cap = self.capacity()
        fetch = self._fetch(cap)
        if not fetch:
            return 0   # no free slot in any lane this process serves
        res = await self._claim_round(asyncio.get_running_loop(), executor, cap, fetch)
        if res is None:
            return 0
        self._take(res)
        return len(res.jobs)

    async def flush(self) -> int:
        """Wait for every attempt started so far to finish, then record all pending results in the
        store in one batch (the flusher's path: ``settle_dispatch``); return how many were recorded.

        After it returns, each attempt started by :meth:`claim_once` has its result in the ledger:
        the fire is terminal or ``pending`` with its retry instant (``next_attempt_us``). When the
        store refuses the batch the results are kept (a later ``flush()`` records them) and the
        error propagates. An attempt is bounded by its timeout, so this wait is too.
        """
        executor = self._stepping()
        while self._tasks:   # held attempts start as these end, or are settled at their timeout
            await asyncio.wait(set(self._tasks))
        batch, self._results = self._results, []
        if not batch:
            return 0
        try:
            return await self._record(asyncio.get_running_loop(), executor, batch)
        except Exception:
            self._results[:0] = batch
            raise

    async def aclose(self) -> None:
        """Release what the stepping API opened (the HTTP session it created, its store thread).
        Attempts still running are waited for, their results left unrecorded (call :meth:`flush`
        first to record them)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))
        self._gate.close()
        if self._step_executor is not None:
            self._step_executor.shutdown(wait=False)
            self._step_executor = None
        if self._own_step_sender and self.sender is not None:
            await self.sender.close()
            self.sender = None
            self._own_step_sender = False

    async def __aenter__(self) -> Dispatcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def run(self) -> None:
        """Claim and attempt until :meth:`stop`: each round is :meth:`claim_once`'s, results recorded in
        batches by a background flusher; sleeps until woken (a commit, a finished attempt, a retry due) or
        ``idle_s`` × 0.5–1 (jittered: dispatchers polling one store never fall into lockstep, where the
        first to poll takes every batch). Returns within ``drain_s`` of ``stop()``."""
        if self._running:
            raise RuntimeError("run() is already running")
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._flush_event = asyncio.Event()
        own_sender = self.sender is None
        if self.sender is None:
            self.sender = self._new_sender()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dispatch-store")
        flusher = asyncio.create_task(self._flusher(loop, executor))
        tasks = self._tasks
        self._running = True
        try:
            while not self._stopping:
                self._wake.clear()
                cap = self.capacity()
                fetch = self._fetch(cap)
                wait_s = self.idle_s * random.uniform(0.5, 1.0)   # jittered (docstring)
                self._left = True   # until a claim round says otherwise (no free slot: work may be left)
                if fetch:
                    try:
                        got = await self._claim_round(loop, executor, cap, fetch, fold=True)
                        if got is None:
                            break   # stop() does not wait for a claim stuck in the store
                        res = got
                        full = any(res.offered.get(lane, 0) >= n for lane, n in fetch.items())
                        self._left = full or bool(res.waiting)
                    except Exception:
                        log.exception("claiming fires failed; retrying")
                        res, full, wait_s = ClaimResult([], None, {}, {}), False, 0.5
                    self._take(res)
                    if res.jobs and (full or res.waiting) and self.capacity().total > 0:
                        continue   # a full window: there may be more to claim right away
                    if res.wake_us is not None:
                        wait_s = min(wait_s, max(0.001, (res.wake_us - self.clock.now().latest_us) / 1e6))
                    elif res.waiting and self.capacity().total > 0:
                        wait_s = min(wait_s, 0.1)   # held back by an in-flight quota: look again soon
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=wait_s)
                except TimeoutError:
                    pass
        finally:
            # Bounded stop (invariant 17): the attempts in flight and the recording of their results
            # get ``drain_s`` together; whatever is left then is cancelled, never waited for.
            self._stopping = True
            deadline = loop.time() + self.drain_s
            # Held attempts start as the ones in flight end (a task ends after starting them).
            while tasks and (left := deadline - loop.time()) > 0:
                await asyncio.wait(set(tasks), timeout=left)
            late = set(tasks)
            if late or self.held:
                log.warning("stopping: %d attempts still in flight after %.1f s are abandoned (their "
                            "leases lapse and they are attempted again)", len(late) + self._drop_held(),
                            self.drain_s)
                for t in late:
                    t.cancel()
                if late:
                    await asyncio.wait(late, timeout=1.0)
            self._gate.close()
            self._drained = True
            self._flush_event.set()
            _, unfinished = await asyncio.wait({flusher}, timeout=max(0.1, deadline - loop.time()))
            if unfinished:
                log.error("stopping: %d attempt results could not be recorded within %.1f s (their leases "
                          "lapse and they are attempted again)", len(self._results), self.drain_s)
                flusher.cancel()
                await asyncio.wait({flusher}, timeout=1.0)
            executor.shutdown(wait=False, cancel_futures=True)
            if own_sender and self.sender is not None:
                await self.sender.close()
                self.sender = None
            self._running = False
