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


def bucket_keys(candidates: Mapping[str, Sequence[Candidate]], config: DispatchConfig) -> list[str]:
    """Every bucket :func:`shape` may read or charge for these candidates, sorted (the store locks
    them in this order, so concurrent claims never deadlock)."""
    keys: set[str] = set()
    for lane, cands in candidates.items():
        if not cands:
            continue
        if config.lane(lane).rate is not None:
            keys.add(lane_key(lane))
        for c in cands:
            keys.add(quota_key(c.tenant_id))
            if lane != Lane.ON_TIME.value:
                keys.add(recovery_key(lane, c.tenant_id))
    return sorted(keys)


def shape(now_us: int, candidates: Mapping[str, Sequence[Candidate]], tenants: Mapping[str, TenantQuota],
          inflight: Mapping[str, int], tats: Mapping[str, int], capacity: Capacity,
          config: DispatchConfig) -> Plan:
    """Admit candidates class by class (see the module docstring) within ``capacity``, the lanes'
    rates, each tenant's in-flight quota and fires/s quota, and the recovery lanes' pace.

    ``inflight`` counts each tenant's attempts in flight in *every* process (live leases);
    ``tats`` is the current state of the buckets named by :func:`bucket_keys` (absent: idle).
    A tenant missing from ``tenants`` gets the default :class:`TenantQuota`.
    """
    plan = Plan()
    state = dict(tats)
    busy = dict(inflight)
    free_total = capacity.total
    free_lane = dict(capacity.lanes)
    free_over = capacity.over_quota
    taken: set[tuple[str, str, int, int]] = set()
    default = TenantQuota()
    on_time = Lane.ON_TIME.value

    def wake(at_us: int) -> None:
        if at_us > now_us and (plan.wake_us is None or at_us < plan.wake_us):
            plan.wake_us = at_us

    def set_tat(key: str, value: int) -> None:
        state[key] = value
        plan.tats[key] = value

    passes: tuple[tuple[str, Admission], ...] = (
        (on_time, Admission.ON_TIME),
        (on_time, Admission.OVER_QUOTA),
        (Lane.CATCH_UP.value, Admission.CATCH_UP),
        (Lane.BACKFILL.value, Admission.BACKFILL),
    )
    for lane, cls in passes:
        lane_cfg = config.lane(lane)
        lane_rate = None if lane_cfg.rate is None else Rate(lane_cfg.rate, lane_cfg.burst)
        for c in candidates.get(lane, ()):
            if free_total <= 0 or free_lane.get(lane, 0) <= 0:
                break
            if cls == Admission.OVER_QUOTA and free_over <= 0:
                break
            if c.key in taken:
                continue
            q = tenants.get(c.tenant_id, default)
            if busy.get(c.tenant_id, 0) >= q.inflight:
                continue
            if lane_rate is not None:
                lk = lane_key(lane)
                if not conforms(state.get(lk, 0), now_us, lane_rate):
                    wake(next_conforming(state.get(lk, 0), lane_rate))
                    break
            if q.fires_per_s <= 0:
                continue  # a tenant with no quota sends nothing
            qk = quota_key(c.tenant_id)
            quota = quota_rate(q, config)
            qtat = state.get(qk, 0)
            within = conforms(qtat, now_us, quota)
            got = cls
            if cls == Admission.ON_TIME:
                if not within:
                    wake(next_conforming(qtat, quota))
                    continue          # offered again below, as over-quota work
            elif cls == Admission.OVER_QUOTA:
                if within:
                    got = Admission.ON_TIME
            else:
                pace = Rate(q.fires_per_s * q.catchup_fraction, 1.0) if q.catchup_fraction > 0 else None
                if pace is None:
                    continue
                rk = recovery_key(lane, c.tenant_id)
                rtat = state.get(rk, 0)
                if not conforms(rtat, now_us, pace):
                    wake(next_conforming(rtat, pace))
                    continue
                if not within:
                    wake(next_conforming(qtat, quota))
                    continue
                set_tat(rk, charge(rtat, now_us, pace))
            new_q = charge(qtat, now_us, quota)
            if got == Admission.OVER_QUOTA:
                # A bounded debt: at most ``over_quota_debt_s`` of quota past the burst.
                cap = math.ceil(now_us + quota.limit_us + config.over_quota_debt_s * 1e6)
                new_q = max(qtat, min(new_q, cap))
            set_tat(qk, new_q)
            if lane_rate is not None:
                lk = lane_key(lane)
                set_tat(lk, charge(state.get(lk, 0), now_us, lane_rate))
            plan.admitted.append((c, got))
            taken.add(c.key)
            busy[c.tenant_id] = busy.get(c.tenant_id, 0) + 1
            free_total -= 1
            free_lane[lane] = free_lane.get(lane, 0) - 1
            if got == Admission.OVER_QUOTA:
                free_over -= 1
    for lane, cands in candidates.items():
        for c in cands:
            if c.key in taken:
                continue
            name = lane
            q = tenants.get(c.tenant_id, default)
            if lane == on_time and (q.fires_per_s <= 0 or not conforms(
                    state.get(quota_key(c.tenant_id), 0), now_us, quota_rate(q, config))):
                name = Admission.OVER_QUOTA.value
            plan.waiting[name] = plan.waiting.get(name, 0) + 1
    return plan
