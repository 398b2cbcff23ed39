"""The attempt runner: claims committed fires from the ledger and makes one HTTP attempt each.

Only committed fires can be claimed (the ledger *is* the queue), so nothing is ever sent for a fire
whose record did not commit. A claim leases the fire until the attempt's deadline plus a margin; a
runner killed mid-attempt leaves the lease to expire and another runner (or this one restarted)
picks the fire up as a further attempt under the same key.

Outcomes: 2xx ``delivered``; 408/429/5xx/connection errors retried with bounded, jittered backoff
(truncated at the trigger's next instant); other 4xx/3xx ``failed`` with the status as cause; a
timeout is attempt result ``unknown`` — retried under the same key while attempts remain, and the
fire ends ``unknown`` when they run out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
from concurrent.futures import ThreadPoolExecutor

from fireledger.clock import Clock
from fireledger.definitions import next_us, recurrence_for
from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import DispatchJob, Lane
from fireledger.observe.metrics import METRICS
from fireledger.recurrence import RecurrenceError, format_instant
from fireledger.store import Settlement, SqlStore

from .credentials import KeyRingFile, authorization_header, body_sha256, mint
from .http import HttpRequest, HttpResult, HttpSender
from .retry import retry_plan

log = logging.getLogger("fireledger.dispatch")

LEASE_MARGIN_US = 5_000_000
DEFAULT_LEASE_US = 30_000_000 + LEASE_MARGIN_US


def dispatch_body(job: DispatchJob, key: str) -> bytes:
    """The JSON body of an HTTP dispatch (DESIGN.md §4)."""
    f = job.fire
    payload = json.loads(job.payload) if job.payload else {}
    return json.dumps({
        "fire_key": key, "trigger_id": f.trigger_id,
        "scheduled_instant": format_instant(from_us(f.scheduled_us)),
        "attempt": job.attempt, "lane": f.lane, "kind": f.kind, "version": f.version,
        "payload": payload,
    }, separators=(",", ":")).encode()


def settle(job: DispatchJob, res: HttpResult, now_us: int, jitter: float,
           until_next_s: float | None = None) -> Settlement:
    """Pure: from an attempt's result to the fire's next state (terminal, or pending + retry time).

    ``until_next_s`` is the time left before the trigger's next scheduled instant: retries are
    truncated there, so one fire's retries never overlap the next fire.
    """
    status = res.http_status
    if res.outcome == "delivered":
        return Settlement(job, "delivered", status, None, "delivered", None, None)
    if res.outcome == "failed":
        cause = f"failed: HTTP {status} is final" if status else f"failed: {res.error}"
        return Settlement(job, "failed", status, res.error, "failed", cause, None)
    delay = retry_plan(job.attempt, max_attempts=job.policies.max_attempts, jitter=jitter,
                       next_scheduled=until_next_s, retry_after_s=res.retry_after_s)
    what = f"HTTP {status}" if status else (res.error or "no answer")
    if delay is None:
        if res.outcome == "unknown":
            return Settlement(job, "unknown", status, res.error, "unknown",
                              f"unknown: no answer within {job.policies.timeout_s:g}s and no attempts left", None)
        return Settlement(job, res.outcome, status, res.error, "failed",
                          f"failed: retries exhausted after {job.attempt} attempts (last: {what})", None)
    return Settlement(job, res.outcome, status, res.error, "pending", None, now_us + int(delay * 1e6))


class Dispatcher:
    """Drains the lanes of the ledger with bounded concurrency."""

    def __init__(self, store: SqlStore, clock: Clock, node_id: str, *,
                 lanes: tuple[str, ...] = (Lane.ON_TIME.value, Lane.CATCH_UP.value, Lane.BACKFILL.value),
                 concurrency: int = 256, batch: int = 512, idle_s: float = 0.5,
                 sender: HttpSender | None = None, keys: KeyRingFile | None = None,
                 issuer: str = "http://127.0.0.1:8080") -> None:
        self.store = store
        self.clock = clock
        self.node_id = node_id
        self.lanes = lanes
        self.concurrency = concurrency
        self.batch = batch
        self.idle_s = idle_s
        self.sender = sender
        self.keys = keys
        self.issuer = issuer
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._results: list[Settlement] = []
        self._flush_event: asyncio.Event | None = None
        self.delivered = 0
        self._inflight = 0

    def _until_next(self, job: DispatchJob, now_us: int) -> float | None:
        """Seconds from now to the trigger's next instant after this fire (None: no next one)."""
        f = job.fire
        try:
            rec = recurrence_for(f.trigger_id, f.version, job.schedule)
            nxt = next_us(rec, f.scheduled_us)
        except RecurrenceError:
            return None
        return None if nxt is None else max(0.0, (nxt - now_us) / 1e6)

    def wake(self) -> None:
        """Fires were committed in this process: claim now instead of at the next idle poll."""
        if self._wake is not None:
            self._wake.set()

    def wake_threadsafe(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.call_soon_threadsafe(self.wake)

    def stop(self) -> None:
        self._stopping = True
        self.wake()

    async def _attempt(self, job: DispatchJob, sem: asyncio.Semaphore) -> None:
        try:
            f = job.fire
            key = str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))
            assert self.sender is not None
            now_s = self.clock.now().latest_us // 1_000_000
            try:
                if job.target.url is None:
                    raise ValueError("the target has no URL")
                body = dispatch_body(job, key)
                headers: dict[str, str] = {}
                if self.keys is not None:
                    # A credential that lives as long as this attempt (ADR-14).
                    token = mint(self.keys.ring(), issuer=self.issuer, audience=job.target.url,
                                 subject=f.trigger_id, fire_key=key, attempt=job.attempt,
                                 body_sha256=body_sha256(body), now_s=now_s,
                                 expires_s=now_s + math.ceil(job.policies.timeout_s) + 1)
                    headers = authorization_header(token)
                req = HttpRequest(url=job.target.url, secret=job.target.secret, fire_key=key,
                                  msg_id=f"{key}.{job.attempt}", timestamp=now_s, body=body,
                                  timeout_s=job.policies.timeout_s, extra_headers=headers)
            except ValueError as exc:
                # A definition that cannot be sent is final, recorded with its cause (never looped).
                res = HttpResult("failed", None, f"cannot build the request: {exc}", 0.0)
            else:
                res = await self.sender.send(req)
            now_us = self.clock.now().latest_us
            METRICS.attempts.labels(f.lane, res.outcome).inc()
            if res.outcome == "delivered":
                METRICS.delivery_lateness.observe((now_us - f.scheduled_us) / 1e6)
            self._results.append(settle(job, res, now_us, random.random(), self._until_next(job, now_us)))
            if self._flush_event is not None:
                self._flush_event.set()
        except Exception:
            log.exception("attempt failed unexpectedly")
        finally:
            sem.release()
            self._inflight -= 1
            if self._inflight <= self.concurrency // 2:
                self.wake()   # room for another claim batch

    async def _flusher(self, loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor) -> None:
        assert self._flush_event is not None
        while not (self._stopping and not self._results):
            await self._flush_event.wait()
            self._flush_event.clear()
            while self._results:
                batch, self._results = self._results, []
                try:
                    oks = await loop.run_in_executor(
                        executor, self.store.settle_attempts, batch, self.clock.now().latest_us)
                    self.delivered += sum(1 for s, ok in zip(batch, oks, strict=True)
                                          if ok and s.state == "delivered")
                    if any(s.state == "pending" for s in batch):
                        self.wake()
                except Exception:
                    log.exception("recording attempt results failed; will retry")
                    self._results[:0] = batch
                    await asyncio.sleep(0.5)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._flush_event = asyncio.Event()
        own_sender = self.sender is None
        if self.sender is None:
            self.sender = HttpSender(limit=self.concurrency, limit_per_host=min(self.concurrency, 64))
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dispatch-store")
        sem = asyncio.Semaphore(self.concurrency)
        flusher = asyncio.create_task(self._flusher(loop, executor))
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not self._stopping:
                self._wake.clear()
                claimed = 0
                for lane in self.lanes:
                    free = self.concurrency - len(tasks)
                    if free <= 0:
                        break
                    now = self.clock.now()
                    jobs = await loop.run_in_executor(
                        executor, self.store.claim_dispatch, lane, now.latest_us, min(free, self.batch),
                        self.node_id, DEFAULT_LEASE_US, LEASE_MARGIN_US)
                    claimed += len(jobs)
                    for job in jobs:
                        await sem.acquire()
                        self._inflight += 1
                        t = asyncio.create_task(self._attempt(job, sem))
                        tasks.add(t)
                        t.add_done_callback(tasks.discard)
                if claimed == 0 or self._inflight > self.concurrency // 2:
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=self.idle_s)
                    except TimeoutError:
                        pass
        finally:
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            self._stopping = True
            self._flush_event.set()
            await flusher
            executor.shutdown(wait=True)
            if own_sender and self.sender is not None:
                await self.sender.close()
