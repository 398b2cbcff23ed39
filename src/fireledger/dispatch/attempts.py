"""Making the attempts a claim round admitted: one task per attempt started, HTTP attempts beyond
their flow's connection limit held first (:mod:`fireledger.dispatch.held`, decision 0242), each
result settled and kept for the next recording. A part of :class:`~fireledger.dispatch.runner.Dispatcher`
(a base class of it: the claim loop, the recording and the stepping API are there).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from typing import TYPE_CHECKING

from prometheus_client import Counter as PromCounter

from fireledger.clock import Clock
from fireledger.domain.dispatch_records import ClaimedJob, Settlement
from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import DispatchJob
from fireledger.observe.logs import attempt_fields
from fireledger.observe.metrics import METRICS, labelled
from fireledger.security.targets import admit
from fireledger.store import Store

from . import shaping
from .credentials import KeyRingFile
from .held import FlowGate, Held
from .http import HttpRequest, HttpResult, HttpSender
from .internal import PREFIX as INTERNAL_PREFIX
from .internal import InternalCall, InternalRegistry
from .lanes import DispatchConfig
from .pool import Flow
from .prepare import build_request, prepared
from .settling import decode_payload, settle, settle_on_error, time_to_next_s

__all__ = ["Attempts"]

log = logging.getLogger("fireledger.dispatch")

ADMISSIONS = PromCounter("fireledger_dispatch_admissions_total", "Attempts started, by lane and service class",
                         ["lane", "admission"], registry=METRICS.registry)


class Attempts:
    """The attempt half of the dispatcher (module docstring); its state is set by ``Dispatcher``."""

    store: Store
    clock: Clock
    config: DispatchConfig
    concurrency: int
    sender: HttpSender | None
    keys: KeyRingFile | None
    issuer: str
    internal: InternalRegistry
    admitted: Counter[str]
    _results: list[Settlement]
    _flush_event: asyncio.Event | None
    _inflight: int
    _over_inflight: int
    _lane_inflight: Counter[str]
    _min_claim: int
    _left: bool
    _tasks: set[asyncio.Task[None]]
    _gate: FlowGate

    if TYPE_CHECKING:   # the dispatcher's, which this half calls (no stub at run time)
        def wake(self) -> None: ...

    # --- one attempt ----------------------------------------------------------------------------

    async def _send(self, job: DispatchJob, key: str, since: float | None = None,
                    req: HttpRequest | None = None) -> HttpResult:
        """Admit and make one attempt; ``req``: the HTTP request already prepared (:func:`.prepare.prepared`)."""
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
            built = build_request(job, key, self.clock.now().latest_us // 1_000_000, self.keys, self.issuer)
            if isinstance(built, HttpResult):
                return built
            req = built
        assert self.sender is not None
        return await self.sender.send(req, since=since)

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

    @property
    def held(self) -> int:
        """Attempts claimed and held back now for a connection of their flow (decision 0242)."""
        held: int = self._gate.held
        return held

    def _held_expired(self, h: Held) -> None:
        """``h`` waited until its timeout: settled ``retry``, not sent, as a wait in the pool ends."""
        claimed, key, _req = h.item
        job = claimed.job
        try:
            assert self.sender is not None
            res = self.sender.held_result(h.flow, job.policies.timeout_s, h.since)
        except Exception as exc:
            self._unexpected(job, None, exc)
            self._finished(claimed)
            return
        self._settle_unsent(claimed, key, res)

    def _settle_unsent(self, claimed: ClaimedJob, key: str, res: HttpResult) -> None:
        """Record ``res`` for an attempt that was never sent (refused, unbuildable, or held past its
        timeout): concluded and logged, or logged as unexpected, and the attempt finished either way."""
        job = claimed.job
        try:
            self._conclude(job, res)
        except Exception as exc:
            self._unexpected(job, res, exc)
        else:
            self._log_result(job, key, res)
        finally:
            self._finished(claimed)

    def _release(self, flow: Flow) -> None:
        """An attempt of ``flow`` ended: start the flow's held attempts the limit has room for."""
        for h in self._gate.release(flow, self._allowed):
            claimed, key, req = h.item
            self._spawn(claimed, flow, h.since, key, req)

    def _drop_held(self) -> int:
        """Forget every held attempt (stopped past the drain: their leases lapse and they are
        attempted again under the same key, as attempts cancelled in flight are); how many."""
        dropped = self._gate.drop()
        for h in dropped:
            self._finished(h.item[0])
        return len(dropped)

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
            req = prepared(self.store, job, key, self.clock.now().latest_us, self.keys, self.issuer)
        except Exception as exc:
            self._unexpected(job, None, exc)
            self._finished(claimed)
            return
        if isinstance(req, HttpResult):   # must not or cannot be sent: settled now, no task
            self._settle_unsent(claimed, key, req)
            return
        # First come first served per flow: held while older ones wait or the limit is in use. Not
        # sent once its timeout has passed waiting: its lease (claim + timeout + margin) holds until then.
        if self._gate.may_start(flow, self._allowed):
            self._spawn(claimed, flow, None, key, req)
        else:
            self._gate.hold((claimed, key, req), flow, job.policies.timeout_s, self._held_expired)

    def _spawn(self, claimed: ClaimedJob, flow: Flow | None, since: float | None, key: str | None = None,
               req: HttpRequest | None = None) -> None:
        t = asyncio.create_task(self._attempt(claimed, flow, since, key, req))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
