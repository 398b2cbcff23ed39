"""Load shaping for the dispatch plane: which due fires start an attempt now. Pure: no clock, no
store, no randomness — the store's claim transaction gathers the inputs, calls :func:`shape` and
applies its plan, so the whole policy is tested with plain values.

Rates are GCRA buckets ("generic cell rate algorithm", a token bucket kept as one instant): a bucket
with rate ``r`` and burst ``b`` keeps ``tat`` (the theoretical arrival time of the next attempt); an
attempt conforms when ``tat - now ≤ (b - 1) / r`` and charging it sets ``tat = max(tat, now) + 1/r``.
One integer per bucket, stored in the ledger's database, so every dispatch process shares it.

Classes, served in this order and shed in the reverse one (the *published shedding order*:
backfill first, then catch-up, then over-quota, and on-time last):

1. ``on-time``    — on-time lane, within the tenant's quota (fires/s and in flight);
2. ``over-quota`` — on-time lane past the tenant's fires/s quota: served only from capacity left
   after every tenant's in-quota work, within ``over_quota_slots``, and still charged (a bounded
   debt) so the tenant stays over quota while it keeps sending;
3. ``catch-up``   — catch-up lane, paced per tenant at ``catchup_fraction × quota`` and within quota;
4. ``backfill``   — backfill lane, paced likewise.

Every attempt — first or retry — is charged to its tenant's quota, and a retry stays in its fire's
lane, so a tenant whose target keeps failing spends its own quota, not the plane's. A tenant's
in-flight quota is a hard limit for every class (a slow or silent target holds at most that many of
the plane's slots). Within a lane, candidates arrive ranked by the store: oldest first within a
trigger, round-robin across a tenant's triggers, round-robin across tenants; ``shape`` keeps that
order within each class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from fireledger.domain.model import Lane

from .lanes import DispatchConfig

__all__ = [
    "SHEDDING_ORDER",
    "Admission",
    "Candidate",
    "Capacity",
    "Plan",
    "Rate",
    "TenantQuota",
    "bucket_keys",
    "charge",
    "conforms",
    "next_conforming",
    "quota_rate",
    "shape",
]


class Admission(StrEnum):
    """Why an attempt was started (its service class)."""

    ON_TIME = "on-time"
    OVER_QUOTA = "over-quota"
    CATCH_UP = "catch-up"
    BACKFILL = "backfill"


#: Under saturation, what waits first (and longest): the published shedding order.
SHEDDING_ORDER: tuple[Admission, ...] = (Admission.BACKFILL, Admission.CATCH_UP, Admission.OVER_QUOTA,
                                         Admission.ON_TIME)


@dataclass(frozen=True, slots=True)
class Rate:
    """A GCRA bucket's parameters: ``per_s`` attempts per second, ``burst`` at once (≥ 1)."""

    per_s: float
    burst: float = 1.0

    @property
    def interval_us(self) -> float:
        return 1e6 / self.per_s

    @property
    def limit_us(self) -> float:
        return (max(1.0, self.burst) - 1.0) * self.interval_us


def conforms(tat_us: int, now_us: int, rate: Rate) -> bool:
    """Whether one more attempt conforms to ``rate`` at ``now_us`` (bucket state ``tat_us``)."""
    return tat_us - now_us <= rate.limit_us


def charge(tat_us: int, now_us: int, rate: Rate) -> int:
    """The bucket state after charging one attempt (rounded up: never faster than the rate)."""
    return math.ceil(max(tat_us, now_us) + rate.interval_us)


def next_conforming(tat_us: int, rate: Rate) -> int:
    """The first instant at which one more attempt conforms."""
    return math.ceil(tat_us - rate.limit_us)


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """A tenant's quota (tenants table): fires/s, attempts in flight, recovery fraction."""

    fires_per_s: float = 100.0
    inflight: int = 100
    catchup_fraction: float = 0.1


@dataclass(frozen=True, slots=True)
class Candidate:
    """A due fire the store offers, in its lane's fair order."""

    tenant_id: str
    trigger_id: str
    scheduled_us: int
    seq: int
    lane: str

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.tenant_id, self.trigger_id, self.scheduled_us, self.seq)


@dataclass(frozen=True, slots=True)
class Capacity:
    """This process's free attempt slots: over all lanes, per lane, and for over-quota work."""

    total: int
    lanes: Mapping[str, int]
    over_quota: int


@dataclass
class Plan:
    """What to start now. ``tats`` holds only the buckets that changed; ``wake_us`` is the earliest
    instant at which a candidate held back by a rate would conform (None: none was); ``waiting``
    counts the candidates left waiting, by the class they were offered for."""

    admitted: list[tuple[Candidate, Admission]] = field(default_factory=list)
    tats: dict[str, int] = field(default_factory=dict)
    wake_us: int | None = None
    waiting: dict[str, int] = field(default_factory=dict)


def lane_key(lane: str) -> str:
    return f"lane:{lane}"


def quota_key(tenant_id: str) -> str:
    return f"quota:{tenant_id}"


def recovery_key(lane: str, tenant_id: str) -> str:
    return f"{lane}:{tenant_id}"


def quota_rate(q: TenantQuota, config: DispatchConfig) -> Rate:
    """A tenant's fires/s bucket: its quota, with a burst of ``quota_burst_s`` of it (at least 1)."""
    return Rate(q.fires_per_s, max(1.0, q.fires_per_s * config.quota_burst_s))


class _HasTenant(Protocol):
    @property
    def tenant_id(self) -> str: ...


def bucket_keys(candidates: Mapping[str, Sequence[_HasTenant]], config: DispatchConfig) -> list[str]:
    """Every bucket :func:`shape` may read or charge for these candidates, sorted (the store locks
    them in this order, so concurrent claims never deadlock). Anything with a ``tenant_id`` will
    do as a candidate here (a :class:`Candidate`, or the store's fire itself)."""
    keys: set[str] = set()
    for lane, cands in candidates.items():
        if not cands:
            continue
        if config.lane(lane).rate is not None:
            keys.add(lane_key(lane))
        tenants = {c.tenant_id for c in cands}
        keys.update(map(quota_key, tenants))
        if lane != Lane.ON_TIME.value:
            keys.update(recovery_key(lane, t) for t in tenants)
    return sorted(keys)


@dataclass
class _Round:
    """The working state of one :func:`shape` call: bucket states as charged so far, attempts in
    flight per tenant, this process's free slots, what was taken, and the plan being built."""

    now_us: int
    tenants: Mapping[str, TenantQuota]
    config: DispatchConfig
    state: dict[str, int]
    busy: dict[str, int]
    free_total: int
    free_lane: dict[str, int]
    free_over: int
    plan: Plan = field(default_factory=Plan)
    taken: set[tuple[str, str, int, int]] = field(default_factory=set)

    def quota(self, tenant_id: str) -> TenantQuota:
        return self.tenants.get(tenant_id, _DEFAULT_QUOTA)

    def wake(self, at_us: int) -> None:
        if at_us > self.now_us and (self.plan.wake_us is None or at_us < self.plan.wake_us):
            self.plan.wake_us = at_us

    def set_tat(self, key: str, value: int) -> None:
        self.state[key] = value
        self.plan.tats[key] = value


_DEFAULT_QUOTA = TenantQuota()

#: The admission passes, in service order (the published shedding order reversed).
_PASSES: tuple[tuple[str, Admission], ...] = (
    (Lane.ON_TIME.value, Admission.ON_TIME),
    (Lane.ON_TIME.value, Admission.OVER_QUOTA),
    (Lane.CATCH_UP.value, Admission.CATCH_UP),
    (Lane.BACKFILL.value, Admission.BACKFILL),
)


def shape(now_us: int, candidates: Mapping[str, Sequence[Candidate]], tenants: Mapping[str, TenantQuota],
          inflight: Mapping[str, int], tats: Mapping[str, int], capacity: Capacity,
          config: DispatchConfig) -> Plan:
    """Admit candidates class by class (see the module docstring) within ``capacity``, the lanes'
    rates, each tenant's in-flight quota and fires/s quota, and the recovery lanes' pace.

    ``inflight`` counts each tenant's attempts in flight in *every* process (live leases);
    ``tats`` is the current state of the buckets named by :func:`bucket_keys` (absent: idle).
    A tenant missing from ``tenants`` gets the default :class:`TenantQuota`.

    Over-quota work is served from this process's *leftover capacity* (decision 0120): the slots
    left free after every in-quota candidate offered to this claim, up to ``capacity.over_quota``.
    Its tenant's bucket is still charged, with a bounded debt, but the debt never holds it back:
    a second process reading the same bucket sees the same debt and serves the tenant's over-quota
    work from its own leftover slots. Only the tenant's in-flight quota (shared by every process)
    and the processes' free slots bound it.
    """
    r = _Round(now_us, tenants, config, dict(tats), dict(inflight), capacity.total, dict(capacity.lanes),
               capacity.over_quota)
    for lane, cls in _PASSES:
        _admit_pass(r, lane, cls, candidates.get(lane, ()))
    _count_waiting(r, candidates)
    return r.plan


def _admit_pass(r: _Round, lane: str, cls: Admission, cands: Sequence[Candidate]) -> None:
    """One class's pass over its lane's candidates, in the store's fair order, until this process
    has no slot left for it (or the lane's global rate holds it back)."""
    lane_cfg = r.config.lane(lane)
    lane_rate = None if lane_cfg.rate is None else Rate(lane_cfg.rate, lane_cfg.burst)
    for c in cands:
        if r.free_total <= 0 or r.free_lane.get(lane, 0) <= 0:
            break
        if cls == Admission.OVER_QUOTA and r.free_over <= 0:
            break
        if c.key in r.taken:
            continue
        q = r.quota(c.tenant_id)
        if r.busy.get(c.tenant_id, 0) >= q.inflight:
            continue
        if lane_rate is not None:
            lk = lane_key(lane)
            if not conforms(r.state.get(lk, 0), r.now_us, lane_rate):
                r.wake(next_conforming(r.state.get(lk, 0), lane_rate))
                break
        if q.fires_per_s <= 0:
            continue  # a tenant with no quota sends nothing
        got = _admission(r, c, q, cls, lane)
        if got is not None:
            _take(r, c, q, got, lane, lane_rate)


def _admission(r: _Round, c: Candidate, q: TenantQuota, cls: Admission, lane: str) -> Admission | None:
    """The class ``c`` is admitted as in this pass (None: not now), charging a recovery lane's pace
    bucket when it is admitted there."""
    quota = quota_rate(q, r.config)
    qtat = r.state.get(quota_key(c.tenant_id), 0)
    within = conforms(qtat, r.now_us, quota)
    if cls == Admission.ON_TIME:
        if not within:
            r.wake(next_conforming(qtat, quota))
            return None          # offered again in the next pass, as over-quota work
        return cls
    if cls == Admission.OVER_QUOTA:
        return Admission.ON_TIME if within else cls
    pace = Rate(q.fires_per_s * q.catchup_fraction, 1.0) if q.catchup_fraction > 0 else None
    if pace is None:
        return None
    rk = recovery_key(lane, c.tenant_id)
    rtat = r.state.get(rk, 0)
    if not conforms(rtat, r.now_us, pace):
        r.wake(next_conforming(rtat, pace))
        return None
    if not within:
        r.wake(next_conforming(qtat, quota))
        return None
    r.set_tat(rk, charge(rtat, r.now_us, pace))
    return cls


def _take(r: _Round, c: Candidate, q: TenantQuota, got: Admission, lane: str, lane_rate: Rate | None) -> None:
    """Admit ``c`` as ``got``: charge its tenant's quota (over quota: a debt capped at
    ``over_quota_debt_s`` past the burst) and the lane's rate, and take the slots."""
    qk = quota_key(c.tenant_id)
    quota = quota_rate(q, r.config)
    qtat = r.state.get(qk, 0)
    new_q = charge(qtat, r.now_us, quota)
    if got == Admission.OVER_QUOTA:
        cap = math.ceil(r.now_us + quota.limit_us + r.config.over_quota_debt_s * 1e6)
        new_q = max(qtat, min(new_q, cap))
    r.set_tat(qk, new_q)
    if lane_rate is not None:
        lk = lane_key(lane)
        r.set_tat(lk, charge(r.state.get(lk, 0), r.now_us, lane_rate))
    r.plan.admitted.append((c, got))
    r.taken.add(c.key)
    r.busy[c.tenant_id] = r.busy.get(c.tenant_id, 0) + 1
    r.free_total -= 1
    r.free_lane[lane] = r.free_lane.get(lane, 0) - 1
    if got == Admission.OVER_QUOTA:
        r.free_over -= 1


def _count_waiting(r: _Round, candidates: Mapping[str, Sequence[Candidate]]) -> None:
    """Count the candidates left waiting, by the class they were offered for (an on-time fire of a
    tenant past its quota waits as over-quota work)."""
    on_time = Lane.ON_TIME.value
    over = Admission.OVER_QUOTA.value
    waiting = r.plan.waiting
    for lane, cands in candidates.items():
        names: dict[str, str] = {}   # per tenant: the state is final here, so one look per tenant
        for c in cands:
            if c.key in r.taken:
                continue
            name = lane
            if lane == on_time:
                name = names.get(c.tenant_id, "")
                if not name:
                    q = r.quota(c.tenant_id)
                    name = names[c.tenant_id] = over if q.fires_per_s <= 0 or not conforms(
                        r.state.get(quota_key(c.tenant_id), 0), r.now_us, quota_rate(q, r.config)) else lane
            waiting[name] = waiting.get(name, 0) + 1
