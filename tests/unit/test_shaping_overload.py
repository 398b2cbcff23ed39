"""The shaper's decision for a tenant over its fires/s quota, across processes (decisions 0031, 0120):
over-quota work is served from each process's leftover slots, the tenant's shared bucket is charged
with a bounded debt that never holds the work back, and a tenant within its quota is served first.

Pure: a fake clock (integers), two simulated dispatch processes sharing the bucket states and the
tenants' in-flight counts exactly as the ledger shares them, each with its own slots.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from fireledger.dispatch.lanes import DispatchConfig
from fireledger.dispatch.shaping import Admission, Candidate, Capacity, TenantQuota, quota_key, shape

S = 1_000_000
MS = 1_000
NOW = 1_800_000_000 * S
CFG = DispatchConfig()
ON_TIME = "on-time"


def cap(total: int = 256, over: int = 128) -> Capacity:
    return Capacity(total, {ON_TIME: total, "catch-up": 32, "backfill": 16}, over)


def due(tenant: str, n: int, at: int = NOW, trigger: str = "tr") -> list[Candidate]:
    return [Candidate(tenant, f"{trigger}{i}", at, 0, ON_TIME) for i in range(n)]


def test_a_second_process_reading_the_debt_still_serves_over_quota_work() -> None:
    """Process A admits the burst in quota and over-quota work up to the tenant's in-flight quota;
    process B, reading the bucket A left (in debt) and A's attempts in flight, serves the rest from
    its own slots. Neither leaves over-quota work waiting for the debt to run down."""
    quota = {"x": TenantQuota(100.0, 250, 0.1)}
    offered = due("x", 300)
    a = shape(NOW, {ON_TIME: offered}, quota, {}, {}, cap(), CFG)
    got_a = Counter(adm.value for _, adm in a.admitted)
    assert got_a == Counter({"on-time": 100, "over-quota": 128})   # the burst, then A's leftover slots
    # The debt is charged but capped: at most one second past the burst.
    assert a.tats[quota_key("x")] <= NOW + 1_990_000 + 1
    left = [c for c in offered if c not in {c for c, _ in a.admitted}]
    b = shape(NOW + MS, {ON_TIME: left}, quota, {"x": 228}, dict(a.tats), cap(), CFG)
    got_b = Counter(adm.value for _, adm in b.admitted)
    assert got_b == Counter({"over-quota": 22})   # up to the in-flight quota (250), none held by the debt
    assert b.waiting == {"over-quota": 50}


def test_a_debt_set_by_a_process_whose_clock_runs_ahead_holds_nothing_back() -> None:
    """Clocks of two processes differ by their ε: a debt capped against the faster clock lies past
    the slower one's cap. Over-quota work is still admitted and the bucket is never moved back."""
    quota = {"x": TenantQuota(100.0, 1000, 0.1)}
    ahead = NOW + 5 * S   # far ahead: a debt far past this process's own cap
    tats = {quota_key("x"): ahead}
    plan = shape(NOW, {ON_TIME: due("x", 50)}, quota, {}, tats, cap(), CFG)
    assert Counter(a.value for _, a in plan.admitted) == Counter({"over-quota": 50})
    assert plan.tats.get(quota_key("x"), ahead) == ahead


@dataclass
class Plane:
    """Two dispatch processes sharing one ledger: bucket states and leases are shared, slots
    (``slots`` each, half of them for over-quota work) are each process's own. The store offers
    due fires in its fair order: oldest first within a tenant, round-robin across tenants. An
    attempt holds its slot and its tenant's in-flight count for ``hold_us`` (send and record)."""

    quotas: dict[str, TenantQuota]
    slots: int = 256
    hold_us: int = 20 * MS
    tats: dict[str, int] = field(default_factory=dict)
    leases: list[tuple[int, int, str, bool]] = field(default_factory=list)   # (until, process, tenant, over)
    queues: dict[str, deque[Candidate]] = field(default_factory=dict)
    waited: dict[str, list[int]] = field(default_factory=dict)
    classes: Counter[tuple[str, str]] = field(default_factory=Counter)

    def window(self, limit: int) -> list[Candidate]:
        """The store's fair order (round-robin across tenants), ``limit`` long."""
        out: list[Candidate] = []
        lists = [list(q) for q in self.queues.values()]
        for rank in range(max((len(x) for x in lists), default=0)):
            out += [x[rank] for x in lists if rank < len(x)]
            if len(out) >= limit:
                break
        return out[:limit]

    def claim(self, process: int, now: int) -> None:
        self.leases = [x for x in self.leases if x[0] > now]
        inflight = Counter(t for _, _, t, _ in self.leases)
        mine = [x for x in self.leases if x[1] == process]
        over = sum(1 for x in mine if x[3])
        free = self.slots - len(mine)
        capacity = Capacity(free, {ON_TIME: free, "catch-up": 0, "backfill": 0}, self.slots // 2 - over)
        window = self.window(2 * self.slots + 16)
        plan = shape(now, {ON_TIME: window}, self.quotas, inflight, self.tats, capacity, CFG)
        self.tats.update(plan.tats)
        taken = {c.key for c, _ in plan.admitted}
        for tenant, q in self.queues.items():
            self.queues[tenant] = deque(c for c in q if c.key not in taken)
        for c, adm in plan.admitted:
            self.leases.append((now + self.hold_us, process, c.tenant_id, adm == Admission.OVER_QUOTA))
            self.waited.setdefault(c.tenant_id, []).append(now - c.scheduled_us)
            self.classes[(c.tenant_id, adm.value)] += 1

    def backlog(self) -> int:
        return sum(len(q) for q in self.queues.values())


def _run(plane: Plane, rates: dict[str, int], seconds: int, step_us: int = 10 * MS) -> None:
    """Fires arrive at ``rates`` per second (all of a tenant's at each whole second, as interval
    triggers anchored together); the two processes claim in turn every ``step_us``."""
    steps = seconds * S // step_us
    for i in range(steps):
        now = NOW + i * step_us
        if (now - NOW) % S == 0:
            for tenant, rate in rates.items():
                plane.queues.setdefault(tenant, deque()).extend(due(tenant, rate, at=now, trigger=f"{tenant}-{now}-"))
        plane.claim(i % 2, now)


def test_one_tenant_at_three_times_its_quota_on_an_idle_plane_is_served_at_capacity() -> None:
    """300 due each second against a 100/s quota, nothing else due, 10 s: every fire is admitted and
    none waits longer than two turnovers of its in-flight quota (100 of the 300 at once). Past the
    first burst the whole load is over quota — every attempt is charged, so a tenant sending over
    its quota stays over it (decision 0031) — and is served from the leftover slots all the same."""
    plane = Plane({"x": TenantQuota()})
    _run(plane, {"x": 300}, 10)
    assert plane.backlog() == 0
    assert len(plane.waited["x"]) == 3000
    assert max(plane.waited["x"]) <= 2 * plane.hold_us + 10 * MS
    assert plane.classes[("x", "on-time")] >= 100
    assert plane.classes[("x", "on-time")] + plane.classes[("x", "over-quota")] == 3000


def test_a_tenant_within_its_quota_is_not_slowed_by_one_over_it() -> None:
    """The same over-quota tenant, and one sending 50/s (within its quota), with 64 slots per
    process. In the first second both are within quota and share the slots round-robin (the small
    one waits at most one claim); from then on the big one is over quota and the small tenant's
    fires are all admitted, in quota, at the first claim after they are due, while the big one's
    over-quota work takes the slots left over."""
    plane = Plane({"x": TenantQuota(), "y": TenantQuota()}, slots=64)
    _run(plane, {"x": 300, "y": 50}, 10)
    waits = plane.waited["y"]   # in admission order: the first second's 50 first
    assert len(waits) == 500 and max(waits[:50]) <= 10 * MS and max(waits[50:]) == 0
    assert plane.classes[("y", "over-quota")] == 0
    assert len(plane.waited["x"]) == 3000 and plane.backlog() == 0   # and the big one is still served
