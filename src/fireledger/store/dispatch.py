"""The dispatch area: claims, shaping state, settlement, queues, outcomes and tenant quotas.


* :meth:`SqlDispatch.claim_shaped` — one claim transaction for all lanes: a bounded batch of
  each lane's due fires, read from an index in order (:mod:`.claim_sql`, decision 0130: what a claim
  reads does not grow with the backlog), in fair order (oldest first within a trigger, round-robin
  across a tenant's triggers and across tenants, held tenants last), locked with ``FOR UPDATE SKIP
  LOCKED`` on PostgreSQL so any number of dispatch processes share the lanes without
  double-claiming (SQLite has one writer); then the rate buckets those fires need
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
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from fireledger.domain.dispatch_records import (
    ON_TIME,
    ClaimedJob,
    ClaimResult,
    ClaimSnapshot,
    Settlement,
    Shaper,
)
from fireledger.domain.evolve import evolve
from fireledger.domain.instants import MAX_US, MIN_US, after_us, clamp_us
from fireledger.domain.model import DispatchJob, Fire, FireKind, FireState, Policies, Target, TriggerVersion

from . import claim_sql
from . import deadletter as dl
from . import rows as rec
from .core import AppendAudit, expect_one
from .dispatching import _ids
from .engine import Engine, StoreError
from .lanes import DispatchDrains
from .queues import OutcomeRejected
from .redrive import DispatchRedrive

log = logging.getLogger("fireledger.store")
#: Trigger versions a dispatch store remembers (each holds its sealed payload and schedule).
VERSIONS_CACHED = 4096


class SqlDispatch(DispatchRedrive, DispatchDrains):
    """The dispatch plane's store (module docstring): claims and settlement here, queues, outcomes
    and quotas in :class:`~fireledger.store.queues.DispatchQueues`, dead letters and redrive in
    :class:`~fireledger.store.redrive.DispatchRedrive`."""

    def __init__(self, engine: Engine, append_audit: AppendAudit) -> None:
        super().__init__(engine, append_audit)
        #: Where each lane's tenant walk starts at this process's next claim (decision 0130).
        self._rotation = claim_sql.Rotation()
        #: Trigger versions a claim read (committed, and never changed once written): decision 0236.
        self._versions: dict[tuple[str, int], TriggerVersion] = {}

    def claim_dispatch(self, lane: str, now_us: int, limit: int, owner: str,
                       lease_us: int, lease_margin_us: int = 0) -> list[DispatchJob]:
        """Lease up to ``limit`` dispatchable fires of ``lane`` (pending, or dispatching with an
        expired lease) to ``owner`` until ``now_us + lease_us``; records each attempt as started.
        With ``lease_margin_us``, each lease is then fitted to its own attempt deadline
        (``timeout + margin``), so a killed runner's fires return to the lane soon after.

        On PostgreSQL concurrent dispatchers skip each other's rows (``SKIP LOCKED``). Reads and
        orders the lane's live fires (index ``fires_lane_tenant_due``): a tool and test path, not
        bounded by the backlog; the planes claim with :meth:`claim_shaped` (decisions 0130, 0194).
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
                tid = _target_of(f, v) or v.target_id   # a delivery record: its dead-letter target (0178)
                t = targets.get(tid)
                if t is None:
                    row = c.execute(q["targets_by_ids"], {"id": tid}).fetchone()
                    t = targets[tid] = rec.target(row)
                if f.kind == FireKind.DEAD_LETTER:
                    v = replace(v, policies=dl.delivery_policies(v.policies))
                until = lease_until
                own = now_us + int(v.policies.timeout_s * 1e6) + lease_margin_us
                if lease_margin_us and own != lease_until:
                    # The lease covers this attempt's own deadline plus the margin.
                    c.execute(q["set_lease"], {"tenant_id": f.tenant_id, "trigger_id": f.trigger_id,
                                               "scheduled_us": f.scheduled_us, "seq": f.seq,
                                               "owner": owner, "until_us": own})
                    until = own
                jobs.append(DispatchJob(f, f.attempts, t, v.payload, v.policies, owner, until, v.schedule,
                                        dead_letter=dl.load_dead_fire(c, q, f) if f.kind == FireKind.DEAD_LETTER
                                        else None))
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
                     lease_margin_us: int) -> ClaimResult:
        """Lease the fires ``shaper`` admits, in one transaction (see the module docstring).

        ``fetch`` maps a lane to how many candidates to offer from it (0 or absent: none). Each
        admitted fire goes ``dispatching``, leased to ``owner`` until its attempt's deadline
        (``now + timeout``) plus ``lease_margin_us``, with its attempt counter raised and an attempt
        row started; a runner that dies leaves the lease to expire and the fire to be claimed again
        as a further attempt under the same key.

        The candidates are a bounded batch read inside the transaction (:mod:`.claim_sql`, decision
        0130): what a claim reads does not grow with the backlog, on either engine.
        """
        with self.engine.write() as c:
            leased, res = self._claim_in(c, now_us, owner, fetch, shaper, lease_margin_us)
        return replace(res, jobs=_jobs(leased, owner, now_us))   # built after the commit (decision 0257)

    def settle_and_claim(self, items: Sequence[Settlement], now_us: int, owner: str, fetch: Mapping[str, int],
                         shaper: Shaper, lease_margin_us: int) -> tuple[list[bool], ClaimResult]:
        """:meth:`settle_dispatch` of ``items``, then :meth:`claim_shaped`, in ONE transaction
        (decision 0233): the results are recorded first, so the claim sees the in-flight quota they
        free, and nothing of either is durable before the commit. Returns what each would return.
        Raises, with nothing recorded and nothing leased, when either refuses as a whole."""
        with self.engine.write() as c:
            oks = self._settle_in(c, items, now_us) if items else []
            leased, res = self._claim_in(c, now_us, owner, fetch, shaper, lease_margin_us)
        return oks, replace(res, jobs=_jobs(leased, owner, now_us))

    def _claim_in(self, c: Any, now_us: int, owner: str, fetch: Mapping[str, int], shaper: Shaper,
                  lease_margin_us: int) -> tuple[list[_Leased], ClaimResult]:
        """:meth:`claim_shaped` inside the caller's write transaction ``c``: what it leased and the
        claim's result without its jobs, which the caller builds (:func:`_jobs`) once the transaction
        has committed (decision 0257)."""
        q = self.q
        cands = self._ranked_candidates(c, now_us, fetch)
        offered = {lane: len(v) for lane, v in cands.items()}
        if not any(offered.values()):
            return [], ClaimResult([], None, {}, offered)
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
        leased = self._lease(c, now_us, owner, decision.admitted, lease_margin_us)
        if decision.tats:
            c.cursor().executemany(q["dp_bucket_set"], [
                {"key": k, "tat_us": int(v)} for k, v in sorted(decision.tats.items())])
        return leased, ClaimResult([], decision.wake_us, dict(decision.waiting), offered)

    def _ranked_candidates(self, c: Any, now_us: int, fetch: Mapping[str, int]) -> dict[str, list[Fire]]:
        """Per lane, up to ``fetch[lane]`` due fires in fair order, held tenants last (a bounded
        read: :func:`.claim_sql.read_candidates`)."""
        cands: dict[str, list[Fire]] = {}
        for lane, limit in fetch.items():
            if limit <= 0:
                continue
            rows = claim_sql.read_candidates(c, self.q, lane, now_us, limit, lane != ON_TIME, self._rotation,
                                             lock_batch=self.engine.caps.skip_locked)
            cands[lane] = [rec.fire(r[:-2]) for r in rows]
        return cands

    def _lease(self, c: Any, now_us: int, owner: str, admitted: Sequence[tuple[Fire, str]],
               lease_margin_us: int) -> list[_Leased]:
        """Lease ``admitted`` (and settle those with no attempt left) inside ``c``: the SQL only; the
        jobs are built from what it returns after the commit (:func:`_jobs`)."""
        if not admitted:
            return []
        q = self.q
        versions = self._versions_of(c, {(f.trigger_id, f.version) for f, _ in admitted})
        want = {tid for f, _ in admitted if (tid := _target_of(f, versions.get((f.trigger_id, f.version))))}
        targets = {r[0]: rec.target(r) for r in c.execute(q["dp_targets"], {"ids": _ids(want)}).fetchall()}
        jobs: list[_Leased] = []
        leases: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        lapsed: list[dict[str, Any]] = []
        for f, admission in admitted:
            found = versions.get((f.trigger_id, f.version))
            t = targets.get(_target_of(f, found) or "")
            if found is None or t is None:
                continue   # cannot happen (foreign keys); never lease what cannot be described
            delivery = f.kind == FireKind.DEAD_LETTER   # a dead letter's delivery record (decision 0178)
            v = replace(found, policies=dl.delivery_policies(found.policies)) if delivery else found
            if f.state == "dispatching" and f.attempts > 0:
                # A lapsed lease: its attempt recorded no result. The request may have reached the
                # target, so that attempt is ``unknown`` (invariant 9).
                lapsed.append({**rec.key_params(f), "attempt": f.attempts, "now_us": now_us})
            if f.attempts - f.attempt_base >= v.policies.max_attempts:   # counted from a redrive (0148)
                # The attempt limit holds at claim time too: a fire whose last attempt's lease lapsed
                # (or that is somehow due with no attempt left) is settled, never leased again.
                self._settle_exhausted(c, f, v.policies, now_us)
                continue
            until = after_us(now_us, v.policies.timeout_s) + lease_margin_us
            kp = rec.key_params(f)
            leases.append({**kp, "owner": owner, "until_us": clamp_us(until), "now_us": now_us})
            attempts.append({**kp, "attempt": f.attempts + 1, "now_us": now_us, "owner": owner})
            jobs.append((f, admission, t, v, until, dl.load_dead_fire(c, q, f) if delivery else None))
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

    def _versions_of(self, c: Any, pairs: set[tuple[str, int]]) -> dict[tuple[str, int], TriggerVersion]:
        """The trigger versions ``pairs`` names that exist: read once per process (a version row is
        immutable once committed, and a claim reads only committed rows), at most
        :data:`VERSIONS_CACHED` remembered, then forgotten all at once (decision 0236)."""
        known = self._versions
        out = {p: v for p in pairs if (v := known.get(p)) is not None}
        missing = sorted(pairs - out.keys())
        if missing:
            if len(known) + len(missing) > VERSIONS_CACHED:
                known.clear()
            for row in c.execute(self.q["dp_versions"], {"ids": json.dumps(missing)}).fetchall():
                v = rec.version(row)
                out[(v.trigger_id, v.version)] = known[(v.trigger_id, v.version)] = v
        return out

    def _settle_exhausted(self, c: Any, f: Fire, policies: Policies, now_us: int) -> None:
        """Settle a due fire that has no attempt left instead of leasing it: ``unknown`` when its last
        attempt's lease lapsed (that request may have reached the target, invariant 9), else
        ``failed``; the cause says which. Its dead-letter delivery is recorded with it (0178)."""
        max_attempts = policies.max_attempts
        if f.state == "dispatching":
            state = "unknown"
            cause = (f"unknown: attempt {f.attempts} of {max_attempts} recorded no result before its lease "
                     "lapsed (the dispatch process stopped or lost the store) and no attempts are left")
        else:
            state = "failed"
            cause = f"failed: no attempts left ({f.attempts - f.attempt_base} of {max_attempts} made)"
        n = c.execute(self.q["dp_exhausted"], {**rec.key_params(f), "state": state, "cause": cause,
                                               "now_us": now_us, "attempts": f.attempts}).rowcount
        if n == 1 and dl.wants_delivery(f, state, policies):
            dl.record_delivery(c, self.q, f, now_us)

    def settle_dispatch(self, items: Sequence[Settlement], now_us: int) -> list[bool]:
        """Finish each attempt and settle its fire in one transaction (``Settlement`` items).

        Compare-and-set on (state, lease owner, attempt number): False for an item whose lease was
        lost (another runner owns the fire now); its attempt row is still finished. A fire delivered
        to a ``queue`` target is put on that queue here, in the same transaction, once (the message's
        key is the fire key). A fire that ends ``failed`` or ``unknown`` under a version naming a
        ``dead_letter_target_id`` gets its dead-letter delivery record in the same transaction, once
        (key: the fire's with sequence + 500 000 000; kind ``dead-letter``, ``pending``, ``catch-up``
        lane; decision 0178) — also when the claim settles it for want of attempts. A claimed
        delivery record's job goes to that target, under the default retry policy, with the dead
        fire and its attempts in ``DispatchJob.dead_letter``.

        No item can hold back the others (invariant 15): a ``next_attempt_us`` outside the
        representable range is clamped into it (:mod:`fireledger.domain.instants`); when the batch
        is refused as a whole, each item is recorded on its own (a savepoint each), and an item the
        store still refuses is *set aside*: its attempt is finished and its fire settled ``failed``
        with a cause naming the error class (never a value), and False is returned for it. Only an
        error that is not the item's (the store is down) raises, with nothing recorded.
        """
        with self.engine.write() as c:
            return self._settle_in(c, items, now_us)

    def _settle_in(self, c: Any, items: Sequence[Settlement], now_us: int) -> list[bool]:
        """:meth:`settle_dispatch` inside the caller's write transaction ``c``."""
        items = [it if it.next_attempt_us is None or MIN_US <= it.next_attempt_us <= MAX_US
                 else replace(it, next_attempt_us=clamp_us(it.next_attempt_us)) for it in items]
        try:
            if self._settle_all(c, items, now_us):
                return [True] * len(items)
        except Exception as exc:   # refused as a whole (rolled back to its savepoint): item by item
            log.warning("recording %d attempt results in bulk failed (%s); recording them one by one",
                        len(items), type(exc).__name__)
        return [self._settle_guarded(c, it, now_us) for it in items]

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
        if ok and dl.wants_delivery(f, it.state, it.job.policies):
            dl.record_delivery(c, q, f, now_us)   # in the settling transaction (decision 0178)
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
        if not items or any((it.state == "delivered" and it.job.target.kind == "queue")
                            or dl.wants_delivery(it.job.fire, it.state, it.job.policies) for it in items):
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


#: One fire a claim leased: the fire as read, its admission class, target, version (the dead-letter
#: policies applied for a delivery record), lease end and, for a dead letter's delivery record, the
#: dead fire with its attempts (read in the claim's transaction).
_Leased = tuple[Fire, str, Target, TriggerVersion, int, Fire | None]


def _jobs(leased: Sequence[_Leased], owner: str, now_us: int) -> list[ClaimedJob]:
    """The jobs of what a claim leased, built after its commit (decision 0257): Python work that
    needs nothing of the transaction, so the SQLite writer (one for every process) is held for the
    SQL alone. Each fire as leased: ``dispatching``, its attempt counted, its lease end as its next
    attempt, first dispatched now unless it was before."""
    jobs = []
    for f, admission, t, v, until, dead in leased:
        fire = evolve(f, state=FireState.DISPATCHING, attempts=f.attempts + 1, next_attempt_us=until,
                      dispatched_us=f.dispatched_us if f.dispatched_us is not None else now_us)
        jobs.append(ClaimedJob(DispatchJob(fire, fire.attempts, t, v.payload, v.policies, owner, until,
                                           v.schedule, dead_letter=dead), admission))
    return jobs


def _target_of(f: Fire, v: TriggerVersion | None) -> str | None:
    """Where fire ``f`` of version ``v`` goes: the version's target, or for a dead letter's delivery
    record the version's dead-letter target (decision 0178)."""
    if v is None:
        return None
    return v.policies.dead_letter_target_id if f.kind == FireKind.DEAD_LETTER else v.target_id


__all__ = ["OutcomeRejected", "SqlDispatch"]
