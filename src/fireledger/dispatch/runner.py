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
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge

from fireledger.clock import Clock
from fireledger.domain.dispatch_records import ClaimedJob, ClaimResult, Settlement
from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import DispatchJob
from fireledger.observe.logs import attempt_fields
from fireledger.observe.metrics import METRICS, labelled
from fireledger.security.egress import EgressPolicy
from fireledger.security.targets import admit, admit_now
from fireledger.settings import Settings
from fireledger.store import Store

from . import shaping
from .credentials import KeyRingFile, authorization_header, body_sha256, mint
from .http import HttpRequest, HttpResult, HttpSender
from .internal import PREFIX as INTERNAL_PREFIX
from .internal import REGISTRY, InternalCall, InternalRegistry, load_modules
from .lanes import LANES, DispatchConfig
from .pool import Flow
from .settling import _Shaper, decode_payload, dispatch_body, settle, settle_on_error, time_to_next_s
from .timers import Timer, Timers

__all__ = ["Dispatcher", "decode_payload", "dispatch_body", "settle", "settle_on_error"]

log = logging.getLogger("fireledger.dispatch")

LEASE_MARGIN_US = 5_000_000
#: The longest pause between two tries to record attempt results the store refused (growing 0.25 s a try).
FLUSH_RETRY_MAX_S = 1.0
DEFAULT_LEASE_US = 30_000_000 + LEASE_MARGIN_US

ADMISSIONS = PromCounter("fireledger_dispatch_admissions_total", "Attempts started, by lane and service class",
                         ["lane", "admission"], registry=METRICS.registry)
WAITING = Gauge("fireledger_dispatch_waiting", "Due fires offered but left waiting at the last claim round, "
                "by class (what is being shed)", ["node", "admission"], registry=METRICS.registry)


class _Held:
    """An attempt claimed and held back until its flow has a free connection slot (decision 0242):
    a list entry, not a task. ``since``: the ``loop.time()`` it began to wait (its timeout counts
    from then); ``timer`` settles it, not sent, if it is still waiting at its timeout."""

    __slots__ = ("claimed", "flow", "key", "req", "since", "timer")

    def __init__(self, claimed: ClaimedJob, flow: Flow, key: str, req: HttpRequest | None, since: float) -> None:
        self.claimed = claimed
        self.flow = flow
        self.key = key
        self.req = req   # prepared as it was claimed (None: admission needed the store; done when started)
        self.since = since
        self.timer: Timer | None = None


class Dispatcher:
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
        self._flow_busy: dict[Flow, int] = {}
        self._held: dict[Flow, deque[_Held]] = {}
        self.held = 0   # attempts claimed and held back for a connection of their flow now
        self._held_timers: Timers | None = None
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

    # --- one attempt ----------------------------------------------------------------------------

    async def _send(self, job: DispatchJob, key: str, since: float | None = None,
                    req: HttpRequest | None = None) -> HttpResult:
        """Admit and make one attempt; ``req``: the HTTP request already prepared (:meth:`_prepared`)."""
        if req is None:
            job, refused = await admit(self.store, job, self.clock.now().latest_us)  # trust: re-check + decrypt
            if refused is not None:   # target unverified/lapsed or payload unreadable: not called, cause recorded
                return HttpResult("failed", None, refused, 0.0)
            f = job.fire
            target = job.target
            if target.kind == "queue":
                # Delivery is the put on the tenant's queue, made with the settlement (one transaction).
                return HttpResult("delivered", None, None, 0.0, sent=True)
            if target.kind == "internal":
                name = (target.url or "").removeprefix(INTERNAL_PREFIX)
                call = InternalCall(key, f.trigger_id, from_us(f.scheduled_us), job.attempt, f.lane, f.kind,
                                    f.version, decode_payload(f.tenant_id, job.payload))
                return await self.internal.call(name, f.tenant_id, call, job.policies.timeout_s)
            built = self._request(job, key)
            if isinstance(built, HttpResult):
                return built
            req = built
        assert self.sender is not None
        return await self.sender.send(req, since=since)

    def _request(self, job: DispatchJob, key: str) -> HttpRequest | HttpResult:
        """The signed request of an admitted HTTP attempt, or the final result of one that cannot be built."""
        f = job.fire
        target = job.target
        now_s = self.clock.now().latest_us // 1_000_000
        try:
            if target.url is None:
                raise ValueError("the target has no URL")
            body = dispatch_body(job, key)
            headers: dict[str, str] = {}
            if self.keys is not None:
                # A credential that lives as long as this attempt (ADR-14).
                token = mint(self.keys.ring(max_age_s=1.0), issuer=self.issuer, audience=target.url,
                             subject=f.trigger_id, fire_key=key, attempt=job.attempt,
                             body_sha256=body_sha256(body), now_s=now_s,
                             expires_s=now_s + math.ceil(job.policies.timeout_s) + 1)
                headers = authorization_header(token)
            return HttpRequest(url=target.url, secret=target.secret, fire_key=key,
                               msg_id=f"{key}.{job.attempt}", timestamp=now_s, body=body,
                               timeout_s=job.policies.timeout_s, extra_headers=headers,
                               pinned_addresses=job.pinned_addresses, tenant_id=f.tenant_id)
        except ValueError as exc:
            # A definition that cannot be sent is final, recorded with its cause (never looped).
            return HttpResult("failed", None, f"cannot build the request: {exc}", 0.0)

    def _prepared(self, job: DispatchJob, key: str) -> HttpRequest | HttpResult | None:
        """An HTTP attempt admitted and its request built now, as it is claimed, when admission needs
        no store read (:func:`admit_now`): the request, or the final result of one that must not or
        cannot be sent; None when admission must read the store (done by the attempt's task)."""
        got = admit_now(self.store, job, self.clock.now().latest_us)
        if got is None:
            return None
        admitted, refused = got
        if refused is not None:
            return HttpResult("failed", None, refused, 0.0)
        return self._request(admitted, key)

    def _conclude(self, job: DispatchJob, res: HttpResult) -> None:
        """Count one attempt's result and settle it (kept for the next recording; appended last)."""
        f = job.fire
        now_us = self.clock.now().latest_us
        labelled(METRICS.attempts, f.lane, res.outcome).inc()
        if res.outcome == "delivered":
            METRICS.delivery_lateness.observe((now_us - f.scheduled_us) / 1e6)
        # The time left before the next instant bounds retries only: not computed for a final result.
        until_next = None if res.outcome in ("delivered", "failed") else time_to_next_s(job, now_us)
        self._results.append(settle(job, res, now_us, random.random(), until_next))

    @staticmethod
    def _log_result(job: DispatchJob, key: str, res: HttpResult) -> None:
        f = job.fire
        level = logging.DEBUG if res.outcome == "delivered" else logging.INFO
        if log.isEnabledFor(level):
            log.log(level, "attempt %s", res.outcome,
                    extra=attempt_fields(key, job.attempt, res.outcome, trigger_id=f.trigger_id, lane=f.lane,
                                         http_status=res.http_status, duration_s=res.duration_s))

    def _unexpected(self, job: DispatchJob, res: HttpResult | None, exc: Exception) -> None:
        # Every exception path settles the attempt with a cause (finding 5 of issue 13).
        log.error("attempt %d of a fire of trigger %s failed unexpectedly (%s); recorded with that cause",
                  job.attempt, job.fire.trigger_id, type(exc).__name__)
        self._results.append(settle_on_error(job, res, exc, self.clock.now().latest_us))

    async def _attempt(self, claimed: ClaimedJob, flow: Flow | None = None, since: float | None = None,
                       key: str | None = None, req: HttpRequest | None = None) -> None:
        job = claimed.job
        f = job.fire
        res: HttpResult | None = None
        recorded = False
        try:
            if key is None:
                key = str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))
            try:
                res = await self._send(job, key, since, req)
            finally:
                if flow is not None:   # the connection is back: the flow's next held attempt may start
                    self._release(flow)
                    flow = None
            self._conclude(job, res)
            recorded = True
            self._log_result(job, key, res)
        except Exception as exc:
            if not recorded:
                self._unexpected(job, res, exc)
        finally:
            if flow is not None:
                self._release(flow)
            self._finished(claimed)

    def _finished(self, claimed: ClaimedJob) -> None:
        """An attempt (started or held) is over: its slots are free, and a claim round may follow."""
        f = claimed.job.fire
        if self._flush_event is not None:
            self._flush_event.set()
        self._inflight -= 1
        self._lane_inflight[f.lane] -= 1
        if claimed.admission == shaping.Admission.OVER_QUOTA.value:
            self._over_inflight -= 1
        lane_free = self.config.lane(f.lane).concurrency - self._lane_inflight[f.lane]
        # Room for another claim round: worth one only if the last left work behind (decision 0151).
        if self._left and (self.concurrency - self._inflight >= self._min_claim or lane_free == 1):
            self.wake()

    # --- attempts held for a connection of their flow (decision 0242) ----------------------------

    def _flow_of(self, job: DispatchJob) -> Flow | None:
        """The flow of an HTTP attempt (None: not HTTP, or a URL the sender will refuse anyway)."""
        target = job.target
        if self.sender is None or target.url is None or target.kind in ("queue", "internal"):
            return None
        try:
            return self.sender.flow(target.url, job.fire.tenant_id)
        except ValueError:
            return None

    def _allowed(self, flow: Flow) -> int:
        """Attempts of ``flow`` its adaptive limit lets be in flight now (a closed sender: all of
        them — each then fails at once, with its cause, as it did before)."""
        assert self.sender is not None
        try:
            return self.sender.flow_allowed(flow)
        except RuntimeError:
            return self.concurrency

    def _hold(self, claimed: ClaimedJob, flow: Flow, key: str, req: HttpRequest | None) -> None:
        loop = asyncio.get_running_loop()
        timers = self._held_timers
        if timers is None or timers.loop is not loop:
            timers = self._held_timers = Timers(loop)
        h = _Held(claimed, flow, key, req, loop.time())
        # Not sent once its timeout has passed waiting: its lease (claim + timeout + margin) holds until then.
        h.timer = timers.call_at(h.since + claimed.job.policies.timeout_s, self._held_expired, h)
        q = self._held.get(flow)
        if q is None:
            q = self._held[flow] = deque()
        q.append(h)
        self.held += 1

    def _held_expired(self, h: _Held) -> None:
        """``h`` waited until its timeout: settled ``retry``, not sent, as a wait in the pool ends."""
        q = self._held.get(h.flow)
        if q is None or h not in q:
            return
        q.remove(h)
        if not q:
            del self._held[h.flow]
        self.held -= 1
        job = h.claimed.job
        res: HttpResult | None = None
        try:
            assert self.sender is not None
            res = self.sender.held_result(h.flow, job.policies.timeout_s, h.since)
            self._conclude(job, res)
        except Exception as exc:
            self._unexpected(job, res, exc)
        else:
            self._log_result(job, h.key, res)
        finally:
            self._finished(h.claimed)

    def _release(self, flow: Flow) -> None:
        """An attempt of ``flow`` ended: start the flow's held attempts, oldest first, while its limit
        has room (the limit may have grown with this attempt's success, or shrunk with its drop)."""
        busy = self._flow_busy[flow] - 1
        q = self._held.get(flow)
        if q is not None:   # (none once stop has dropped them: _drop_held)
            allowed = self._allowed(flow)
            while q and busy < allowed:
                h = q.popleft()
                if h.timer is not None:
                    h.timer.cancel()
                self.held -= 1
                busy += 1
                self._spawn(h.claimed, flow, h.since, h.key, h.req)
            if not q:
                del self._held[flow]
        if busy:
            self._flow_busy[flow] = busy
        else:
            del self._flow_busy[flow]

    def _drop_held(self) -> int:
        """Forget every held attempt (stopped past the drain: their leases lapse and they are
        attempted again under the same key, as attempts cancelled in flight are); how many."""
        dropped = self.held
        for q in self._held.values():
            for h in q:
                if h.timer is not None:
                    h.timer.cancel()
                self._finished(h.claimed)
        self._held.clear()
        self.held = 0
        return dropped

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
                await asyncio.sleep(pause)   # results finishing meanwhile share the transaction (0152)
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

    def _start(self, claimed: ClaimedJob) -> None:
        lane = claimed.job.fire.lane
        self._inflight += 1
        self._lane_inflight[lane] += 1
        if claimed.admission == shaping.Admission.OVER_QUOTA.value:
            self._over_inflight += 1
        self.admitted[claimed.admission] += 1
        labelled(ADMISSIONS, lane, claimed.admission).inc()
        job = claimed.job
        flow = self._flow_of(job)
        if flow is None:
            self._spawn(claimed, None, None)
            return
        f = job.fire
        key = str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))
        try:
            req = self._prepared(job, key)
        except Exception as exc:
            self._unexpected(job, None, exc)
            self._finished(claimed)
            return
        if isinstance(req, HttpResult):   # must not or cannot be sent: settled now, no task
            try:
                self._conclude(job, req)
            except Exception as exc:
                self._unexpected(job, req, exc)
            else:
                self._log_result(job, key, req)
            finally:
                self._finished(claimed)
            return
        # First come first served per flow: held while older ones wait or the limit is in use.
        busy = self._flow_busy.get(flow, 0)
        if flow in self._held or busy >= self._allowed(flow):
            self._hold(claimed, flow, key, req)
            return
        self._flow_busy[flow] = busy + 1
        self._spawn(claimed, flow, None, key, req)

    def _spawn(self, claimed: ClaimedJob, flow: Flow | None, since: float | None, key: str | None = None,
               req: HttpRequest | None = None) -> None:
        t = asyncio.create_task(self._attempt(claimed, flow, since, key, req))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

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
        if self._held_timers is not None:
            self._held_timers.close()
            self._held_timers = None
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
            if self._held_timers is not None:
                self._held_timers.close()
                self._held_timers = None
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
