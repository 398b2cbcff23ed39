"""The dispatch area: claims, shaping state, settlement, queues, outcomes and tenant quotas.


* :meth:`SqlDispatch.claim_shaped` — one claim transaction for all lanes: the due fires of
  each lane in fair order (oldest first within a trigger, round-robin across a tenant's triggers and
  across tenants), locked with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL so any number of dispatch
  processes share the lanes without double-claiming (on SQLite, one writer, the ranking is read just
  before the write transaction and re-checked inside it); then the rate buckets those fires need
  (locked in key order, so concurrent claims never deadlock), the tenants' quotas and their attempts
  in flight in every process; a caller-supplied *shaper* (``fireledger.dispatch.shaping``) decides;
  the store leases the admitted fires, records their attempts and the new bucket states, and commits.
* :meth:`SqlDispatch.settle_dispatch` — finish attempts and settle fires (compare-and-set on
  the lease), and for a ``queue`` target put the delivered fire on the tenant's queue in the same
  transaction.
* Queues (``queue_pull``, ``queue_ack``, ``queue_stats``): at-least-once, a visibility timeout,
  ack by fire key. A message references its fire; the payload is read from the registry at pull.
* Outcomes (``record_outcome``, ``get_outcome``, ``outcome_context``): ``work_outcomes`` holds
  ``succeeded`` / ``failed``; no row is ``unknown``. Signed callbacks are replay-guarded by their
  ``webhook-id`` (``callback_receipts``).
* Tenant quotas (``tenant_quota``, ``set_tenant_quota``): the tenants table's columns.

Lists of ids are bound as one JSON array parameter (``json_each`` on SQLite,
``jsonb_array_elements`` on PostgreSQL), so every statement has a fixed text.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fireledger.domain.dispatch_records import (
    ON_TIME,
    ClaimedJob,
    ClaimResult,
    ClaimSnapshot,
    RankCache,
    Settlement,
    Shaper,
)
from fireledger.domain.instants import MAX_US, MIN_US, after_us, clamp_us
from fireledger.domain.model import DispatchJob, Fire, FireState, Target, TriggerVersion

from . import rows as rec
from .core import expect_one
from .dispatching import _ids
from .engine import StoreError
from .queues import OutcomeRejected
from .redrive import DispatchRedrive

log = logging.getLogger("fireledger.store")


def _pk(f: Fire) -> tuple[str, str, int, int]:
    return (f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)


class SqlDispatch(DispatchRedrive):
    """The dispatch plane's store (module docstring): claims and settlement here, queues, outcomes
    and quotas in :class:`~fireledger.store.queues.DispatchQueues`, dead letters and redrive in
    :class:`~fireledger.store.redrive.DispatchRedrive`."""

    def claim_dispatch(self, lane: str, now_us: int, limit: int, owner: str,
                       lease_us: int, lease_margin_us: int = 0) -> list[DispatchJob]:
        """Lease up to ``limit`` dispatchable fires of ``lane`` (pending, or dispatching with an
        expired lease) to ``owner`` until ``now_us + lease_us``; records each attempt as started.
        With ``lease_margin_us``, each lease is then fitted to its own attempt deadline
        (``timeout + margin``), so a killed runner's fires return to the lane soon after.

        On PostgreSQL concurrent dispatchers skip each other's rows (``SKIP LOCKED``).
        """
        q = self.q
        lease_until = now_us + lease_us
        with self.engine.write() as c:
            rows = c.execute(q["claim_fires"], {"owner": owner, "lease_until_us": lease_until,
                                                "now_us": now_us, "lane": lane, "limit": limit}).fetchall()
            fires = [rec.fire(r) for r in rows]
            for f in fires:
                c.execute(q["insert_attempt"], {
                    "tenant_id": f.tenant_id, "trigger_id": f.trigger_id, "scheduled_us": f.scheduled_us,
                    "seq": f.seq, "attempt": f.attempts, "started_us": now_us, "node": owner})
            versions: dict[tuple[str, int], TriggerVersion] = {}
            targets: dict[str, Target] = {}
            jobs = []
            for f in fires:
                vk = (f.trigger_id, f.version)
                v = versions.get(vk)
                if v is None:
                    row = c.execute(q["get_version"], {"trigger_id": f.trigger_id, "version": f.version}).fetchone()
                    v = versions[vk] = rec.version(row)
                t = targets.get(v.target_id)
                if t is None:
                    row = c.execute(q["targets_by_ids"], {"id": v.target_id}).fetchone()
                    t = targets[v.target_id] = rec.target(row)
                until = lease_until
                own = now_us + int(v.policies.timeout_s * 1e6) + lease_margin_us
                if lease_margin_us and own != lease_until:
                    # The lease covers this attempt's own deadline plus the margin.
                    c.execute(q["set_lease"], {"tenant_id": f.tenant_id, "trigger_id": f.trigger_id,
                                               "scheduled_us": f.scheduled_us, "seq": f.seq,
                                               "owner": owner, "until_us": own})
                    until = own
                jobs.append(DispatchJob(f, f.attempts, t, v.payload, v.policies, owner, until, v.schedule))
        return jobs

    def settle_attempts(self, items: Sequence[Settlement], now_us: int) -> list[bool]:
        """Finish each job's attempt row and settle its fire — a terminal state, or back to
        ``pending`` with ``next_attempt_us`` for a retry — in one transaction.

        Compare-and-set on (state, lease owner, attempt number): False for an item whose lease was
        lost (another runner owns the fire now); its attempt row is still finished.
        """
        out = []
        with self.engine.write() as c:
            for it in items:
                f = it.job.fire
                key = {"tenant_id": f.tenant_id, "trigger_id": f.trigger_id,
                       "scheduled_us": f.scheduled_us, "seq": f.seq}
                c.execute(self.q["finish_attempt"], {
                    **key, "attempt": it.job.attempt, "finished_us": now_us, "result": str(it.result),
                    "http_status": it.http_status, "error": it.error})
                terminal = it.state != "pending"
                out.append(expect_one(c.execute(self.q["settle_fire"], {
                    **key, "state": str(it.state), "cause": it.cause, "next_attempt_us": it.next_attempt_us,
                    "finished_us": now_us if terminal else None, "owner": it.job.lease_owner,
                    "attempt": it.job.attempt}).rowcount, "settle_fire"))
        return out

    def claim_shaped(self, now_us: int, owner: str, fetch: Mapping[str, int], shaper: Shaper,
                     lease_margin_us: int, cache: RankCache | None = None) -> ClaimResult:
        """Lease the fires ``shaper`` admits, in one transaction (see the module docstring).

        ``fetch`` maps a lane to how many candidates to offer from it (0 or absent: none). Each
        admitted fire goes ``dispatching``, leased to ``owner`` until its attempt's deadline
        (``now + timeout``) plus ``lease_margin_us``, with its attempt counter raised and an attempt
        row started; a runner that dies leaves the lease to expire and the fire to be claimed again
        as a further attempt under the same key.

        ``cache`` (SQLite only; ignored on PostgreSQL, where the order is read under ``SKIP LOCKED``
        inside the transaction) lets a dispatcher reuse one ranking of a large backlog over several
        rounds (:class:`RankCache`).
        """
        ranked_first = not self.engine.caps.skip_locked   # one writer: rank before the write transaction
        if ranked_first:
            # SQLite has one writer: rank outside the write transaction (WAL readers block no one,
            # so the timing loop keeps committing while a large backlog is ranked), then keep, in
            # the transaction, only the candidates that are still live and due.
            pre = {}
            to_rank = {}
            for lane, limit in fetch.items():
                # Only the on-time lane's order is kept between rounds: the recovery lanes are paced
                # and drained in the published shedding order, which must see their fires as they are.
                use_cache = cache is not None and lane == ON_TIME
                cached = cache.take(lane, now_us, limit) if use_cache and cache is not None and limit > 0 else None
                if cached is None:
                    to_rank[lane] = max(limit, cache.depth) if use_cache and cache is not None else limit
                else:
                    pre[lane] = cached
            if to_rank:
                started = time.perf_counter_ns()
                with self.engine.read() as c:
                    ranked = self._ranked_candidates(c, now_us, to_rank)
                cost_us = (time.perf_counter_ns() - started) // 1000
                for lane, fires in ranked.items():
                    if cache is not None and lane == ON_TIME:
                        cache.keep(lane, now_us, fires, cost_us)
                    pre[lane] = fires[:fetch[lane]]
        try:
            return self._claim_in_transaction(now_us, owner, fetch, shaper, lease_margin_us,
                                              pre if ranked_first else None, cache)
        except BaseException:
            if cache is not None:
                cache.lanes.clear()   # the order may be stale in unknown ways: rank afresh
            raise

    def _claim_in_transaction(self, now_us: int, owner: str, fetch: Mapping[str, int], shaper: Shaper,
                              lease_margin_us: int, pre: dict[str, list[Fire]] | None,
                              cache: RankCache | None) -> ClaimResult:
        q = self.q
        with self.engine.write() as c:
            if pre is not None:
                keys_json = json.dumps([[f.tenant_id, f.trigger_id, f.scheduled_us, f.seq]
                                        for fs in pre.values() for f in fs])
                fresh = {(r[0], r[1], r[2], r[3]): rec.fire(r) for r in c.execute(
                    q["dp_still_due"], {"ids": keys_json, "now_us": now_us}).fetchall()}
                cands = {lane: [fresh[k] for k in (_pk(f) for f in fs) if k in fresh] for lane, fs in pre.items()}
                # Another claimer (a thread or process sharing the file) took most of this order
                # between the ranking and the lock: rank that lane again, now under the lock, so a
                # contended round still offers what is due instead of coming back empty.
                short = {lane: fetch[lane] for lane, fs in pre.items() if fs and 2 * len(cands[lane]) < len(fs)}
                if short:
                    cands.update(self._ranked_candidates(c, now_us, short))
                    if cache is not None:
                        for lane in short:
                            cache.lanes.pop(lane, None)
            else:
                cands = self._ranked_candidates(c, now_us, fetch)
            offered = {lane: len(v) for lane, v in cands.items()}
            if not any(offered.values()):
                if cache is not None and pre is not None:
                    for lane, fs in pre.items():
                        cache.settle(lane, fs, {_pk(f) for f in fs})
                return ClaimResult([], None, {}, offered)
            keys = shaper.bucket_keys(cands)
            tats: dict[str, int] = {}
            if keys:
                c.execute(q["dp_bucket_seed"], {"ids": json.dumps(keys)})
                tats = {k: int(t) for k, t in c.execute(q["dp_bucket_lock"], {"ids": json.dumps(keys)}).fetchall()}
            tenants = {f.tenant_id for fs in cands.values() for f in fs}
            quotas = {r[0]: (float(r[1]), int(r[2]), float(r[3]))
                      for r in c.execute(q["dp_quotas"], {"ids": _ids(tenants)}).fetchall()}
            inflight = {r[0]: int(r[1]) for r in c.execute(
                q["dp_inflight"], {"ids": _ids(tenants), "now_us": now_us}).fetchall()}
            decision = shaper.decide(ClaimSnapshot(now_us, cands, quotas, inflight, tats))
            jobs = self._lease(c, now_us, owner, decision.admitted, lease_margin_us)
            if decision.tats:
                c.cursor().executemany(q["dp_bucket_set"], [
                    {"key": k, "tat_us": int(v)} for k, v in sorted(decision.tats.items())])
        if cache is not None and pre is not None:
            leased = {_pk(f) for f, _ in decision.admitted}
            for lane, fs in pre.items():
                live = {_pk(f) for f in cands.get(lane, ())}
                cache.settle(lane, fs, {k for k in map(_pk, fs) if k in leased or k not in live})
        return ClaimResult(jobs, decision.wake_us, dict(decision.waiting), offered)

    def _ranked_candidates(self, c: Any, now_us: int, fetch: Mapping[str, int]) -> dict[str, list[Fire]]:
        q = self.q
        cands: dict[str, list[Fire]] = {}
        for lane, limit in fetch.items():
            if limit <= 0:
                continue
            query = q["dp_candidates"] if lane == ON_TIME else q["dp_candidates_paced"]
            rows = c.execute(query, {"lane": lane, "now_us": now_us, "limit": limit}).fetchall()
            rows = sorted(rows, key=lambda r: (r[-2], r[-1], r[15], r[0]))   # held, rn, next attempt, tenant
            cands[lane] = [rec.fire(r[:-2]) for r in rows]
        return cands

    def _lease(self, c: Any, now_us: int, owner: str, admitted: Sequence[tuple[Fire, str]],
               lease_margin_us: int) -> list[ClaimedJob]:
        if not admitted:
            return []
        q = self.q
        pairs = sorted({(f.trigger_id, f.version) for f, _ in admitted})
        versions: dict[tuple[str, int], TriggerVersion] = {}
        for row in c.execute(q["dp_versions"], {"ids": json.dumps(pairs)}).fetchall():
            v = rec.version(row)
            versions[(v.trigger_id, v.version)] = v
        targets = {r[0]: rec.target(r) for r in c.execute(
            q["dp_targets"], {"ids": _ids({v.target_id for v in versions.values()})}).fetchall()}
        jobs: list[ClaimedJob] = []
        leases: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        lapsed: list[dict[str, Any]] = []
        for f, admission in admitted:
            found = versions.get((f.trigger_id, f.version))
            t = targets.get(found.target_id) if found is not None else None
            if found is None or t is None:
                continue   # cannot happen (foreign keys); never lease what cannot be described
            v = found
            if f.state == "dispatching" and f.attempts > 0:
                # A lapsed lease: its attempt recorded no result. The request may have reached the
                # target, so that attempt is ``unknown`` (invariant 9).
                lapsed.append({**rec.key_params(f), "attempt": f.attempts, "now_us": now_us})
            if f.attempts - f.attempt_base >= v.policies.max_attempts:   # counted from a redrive (0148)
                # The attempt limit holds at claim time too: a fire whose last attempt's lease lapsed
                # (or that is somehow due with no attempt left) is settled, never leased again.
                self._settle_exhausted(c, f, v.policies.max_attempts, now_us)
                continue
            until = after_us(now_us, v.policies.timeout_s) + lease_margin_us
            p = {**rec.key_params(f), "owner": owner, "until_us": clamp_us(until), "now_us": now_us}
            leases.append(p)
            attempts.append({**rec.key_params(f), "attempt": f.attempts + 1, "now_us": now_us, "owner": owner})
            leased = replace(f, state=FireState.DISPATCHING, attempts=f.attempts + 1, next_attempt_us=until,
                             dispatched_us=f.dispatched_us if f.dispatched_us is not None else now_us)
            jobs.append(ClaimedJob(DispatchJob(leased, leased.attempts, t, v.payload, v.policies, owner, until,
                                               v.schedule), admission))
        cur = c.cursor()
        if lapsed:
            cur.executemany(q["dp_attempt_lapsed"], lapsed)
        if not leases:
            return jobs
        # On PostgreSQL every row is already locked by this transaction (SKIP LOCKED), on SQLite the
        # write lock is held: each update matches exactly its row, which the total checks.
        cur.executemany(q["dp_lease"], leases)
        if cur.rowcount != len(leases):
            raise StoreError(f"leasing {len(leases)} fires matched {cur.rowcount} rows")
        cur.executemany(q["dp_attempt"], attempts)
        return jobs

    def _settle_exhausted(self, c: Any, f: Fire, max_attempts: int, now_us: int) -> None:
        """Settle a due fire that has no attempt left instead of leasing it: ``unknown`` when its last
        attempt's lease lapsed (that request may have reached the target, invariant 9), else
        ``failed``; the cause says which."""
        if f.state == "dispatching":
            state = "unknown"
            cause = (f"unknown: attempt {f.attempts} of {max_attempts} recorded no result before its lease "
                     "lapsed (the dispatch process stopped or lost the store) and no attempts are left")
        else:
            state = "failed"
            cause = f"failed: no attempts left ({f.attempts - f.attempt_base} of {max_attempts} made)"
        c.execute(self.q["dp_exhausted"], {**rec.key_params(f), "state": state, "cause": cause, "now_us": now_us,
                                           "attempts": f.attempts})

    def settle_dispatch(self, items: Sequence[Settlement], now_us: int) -> list[bool]:
        """Finish each attempt and settle its fire in one transaction (``Settlement`` items).

        Compare-and-set on (state, lease owner, attempt number): False for an item whose lease was
        lost (another runner owns the fire now); its attempt row is still finished. A fire delivered
        to a ``queue`` target is put on that queue here, in the same transaction, once (the message's
        key is the fire key).

        No item can hold back the others (invariant 15): a ``next_attempt_us`` outside the
        representable range is clamped into it (:mod:`fireledger.domain.instants`); when the batch
        is refused as a whole, each item is recorded on its own (a savepoint each), and an item the
        store still refuses is *set aside*: its attempt is finished and its fire settled ``failed``
        with a cause naming the error class (never a value), and False is returned for it. Only an
        error that is not the item's (the store is down) raises, with nothing recorded.
        """
        items = [it if it.next_attempt_us is None or MIN_US <= it.next_attempt_us <= MAX_US
                 else replace(it, next_attempt_us=clamp_us(it.next_attempt_us)) for it in items]
        out: list[bool] = []
        with self.engine.write() as c:
            try:
                if self._settle_all(c, items, now_us):
                    return [True] * len(items)
            except Exception as exc:   # refused as a whole (rolled back to its savepoint): item by item
                log.warning("recording %d attempt results in bulk failed (%s); recording them one by one",
                            len(items), type(exc).__name__)
            for it in items:
                out.append(self._settle_guarded(c, it, now_us))
        return out

    def _settle_one(self, c: Any, it: Settlement, now_us: int) -> bool:
        q = self.q
        f = it.job.fire
        key = rec.key_params(f)
        c.execute(q["finish_attempt"], {
            **key, "attempt": it.job.attempt, "finished_us": now_us, "result": str(it.result),
            "http_status": it.http_status, "error": it.error})
        terminal = it.state != "pending"
        n = c.execute(q["settle_fire"], {
            **key, "state": str(it.state), "cause": it.cause, "next_attempt_us": it.next_attempt_us,
            "finished_us": now_us if terminal else None, "owner": it.job.lease_owner,
            "attempt": it.job.attempt}).rowcount
        if n > 1:
            raise StoreError(f"settle_fire matched {n} rows")
        ok = bool(n == 1)
        if ok and it.state == "delivered" and it.job.target.kind == "queue":
            c.execute(q["dp_enqueue"], {**key, "target_id": it.job.target.id, "now_us": now_us})
        return ok

    def _settle_guarded(self, c: Any, it: Settlement, now_us: int) -> bool:
        """One item in its own savepoint; set aside (see :meth:`settle_dispatch`) when refused. A
        failure to roll back to the savepoint (the connection is gone) propagates."""
        c.execute("SAVEPOINT settle_item")
        try:
            ok = self._settle_one(c, it, now_us)
        except Exception as exc:
            c.execute("ROLLBACK TO SAVEPOINT settle_item")
            c.execute("RELEASE SAVEPOINT settle_item")
            what = type(exc).__name__
            f = it.job.fire
            log.error("the result of attempt %d of a fire of trigger %s could not be recorded (%s); "
                      "the fire is set aside as failed", it.job.attempt, f.trigger_id, what)
            aside = replace(it, http_status=None, error=f"not recorded: {what}", state=FireState.FAILED,
                            cause=(f"failed: the result of attempt {it.job.attempt} ({it.result}) could not be "
                                   f"recorded ({what}); the fire was set aside"), next_attempt_us=None)
            c.execute("SAVEPOINT settle_item")
            try:
                self._settle_one(c, aside, now_us)
            except Exception as again:
                c.execute("ROLLBACK TO SAVEPOINT settle_item")
                log.error("setting the fire aside failed too (%s); its lease will lapse", type(again).__name__)
            c.execute("RELEASE SAVEPOINT settle_item")
            return False
        c.execute("RELEASE SAVEPOINT settle_item")
        return ok

    def _settle_all(self, c: Any, items: Sequence[Settlement], now_us: int) -> bool:
        """The common case in bulk: every lease still held and no queue put. Two batched statements
        in a savepoint; when the settle count differs (a lease was lost) the savepoint is rolled
        back, False returned and the caller settles item by item (each statement matches at most
        its own row, so a total equal to the number of items means each matched once). When a
        statement raises, the savepoint is rolled back and the error raised."""
        if not items or any(it.state == "delivered" and it.job.target.kind == "queue" for it in items):
            return False
        q = self.q
        finishes, settles = [], []
        for it in items:
            key = rec.key_params(it.job.fire)
            finishes.append({**key, "attempt": it.job.attempt, "finished_us": now_us, "result": str(it.result),
                             "http_status": it.http_status, "error": it.error})
            settles.append({**key, "state": str(it.state), "cause": it.cause, "next_attempt_us": it.next_attempt_us,
                            "finished_us": now_us if it.state != "pending" else None,
                            "owner": it.job.lease_owner, "attempt": it.job.attempt})
        cur = c.cursor()
        cur.execute("SAVEPOINT settle_bulk")
        try:
            cur.executemany(q["settle_fire"], settles)
            if cur.rowcount != len(settles):
                cur.execute("ROLLBACK TO SAVEPOINT settle_bulk")
                cur.execute("RELEASE SAVEPOINT settle_bulk")
                return False
            cur.executemany(q["finish_attempt"], finishes)
        except Exception:
            cur.execute("ROLLBACK TO SAVEPOINT settle_bulk")
            cur.execute("RELEASE SAVEPOINT settle_bulk")
            raise
        cur.execute("RELEASE SAVEPOINT settle_bulk")
        return True


__all__ = ["OutcomeRejected", "SqlDispatch"]
