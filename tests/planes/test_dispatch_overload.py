"""One tenant over its fires/s quota on an otherwise idle plane is served at the plane's capacity, and a
tenant within its quota is not slowed by it (decisions 0031 and 0120; issue 15).

Real stores on both engines, two steppable dispatchers on their own store connections (two dispatch
processes sharing the ledger), a FakeClock that does not move between claims, real signed HTTP to a
local sink. Every figure is a count: claims, admissions by class, deliveries — never a duration.

The PostgreSQL-only test pins the cause of the split-planes starvation of issue 15: on a ``fires``
table whose statistics are fresh (or stale), the claim's plan re-ran the whole fair ranking once per
due row, so a claim over a few hundred due fires took seconds, one over a few thousand never ended,
the dispatcher's results were never recorded behind it and the tenant stayed at its in-flight quota.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from fireledger.clock import FakeClock
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.keys import from_us
from fireledger.domain.model import Tenant
from fireledger.recurrence import format_instant
from fireledger.registry import Registry, definition
from fireledger.store import Store
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import add_target, add_tenant, store_url

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
S = 1_000_000
QUOTA = 100   # the default tenant quota: 100 fires/s (burst 1 s), 100 attempts in flight


@pytest.fixture
def sink() -> Iterator[SinkServer]:
    s = SinkServer(secrets=[SECRET])
    s.start_in_thread()
    yield s
    s.stop()


def _origin() -> int:
    """A whole second of real time (the sink's replay window accepts the signatures)."""
    return int(time.time()) * S


def _triggers(store: Store, tenant: Tenant, url: str, n: int, start: int, now_us: int | None = None) -> int:
    """``n`` interval triggers of 1 s, all anchored at ``start``: ``n`` fires due at each second,
    the first after ``now_us`` (default ``start``). Returns their first instant."""
    now = start if now_us is None else now_us
    tg = add_target(store, tenant, url=url, secret=SECRET, now_us=now)
    anchor = format_instant(from_us(start))
    defs = [definition({"every": "1s", "anchor": anchor}, tg.id, now_us=now, name=f"ov-{i}") for i in range(n)]
    Registry(store).create_many(tenant.id, "test", defs, now_us=now)
    first = defs[0].next_us
    assert first is not None and all(d.next_us == first for d in defs)
    return first


def _commit(store: Store, clock: FakeClock) -> int:
    """Let the timing plane commit every fire due at the clock's reading; how many it committed."""
    loop = TimingLoop(store, clock, "t1")
    total = 0
    while True:
        got = len(loop.tick().inserted)
        total += got
        if not got:
            return total


def _states(store: Store, tenant_id: str) -> Counter[str]:
    with store.engine.read() as c:
        ph = "?" if store.engine_name == "sqlite" else "%s"
        rows = c.execute(f"SELECT state, COUNT(*) FROM fires WHERE tenant_id = {ph} GROUP BY state",
                         (tenant_id,)).fetchall()
    return Counter({str(s): int(n) for s, n in rows})


async def _drain(dispatchers: list[Dispatcher], store: Store, tenant_id: str, due: int,
                 max_rounds: int) -> int:
    """Rounds (each dispatcher claims once, then each records its results) until ``due`` fires of
    the tenant are delivered; returns the number of rounds (fails past ``max_rounds``)."""
    for rounds in range(1, max_rounds + 1):
        for d in dispatchers:
            await d.claim_once()
        for d in dispatchers:
            await d.flush()
        if _states(store, tenant_id)["delivered"] >= due:
            return rounds
    raise AssertionError(f"not drained in {max_rounds} rounds: {dict(_states(store, tenant_id))}")


def test_a_tenant_three_times_over_its_quota_alone_is_claimed_in_a_bounded_number_of_rounds(
        store: Store, sink: SinkServer) -> None:
    """3 × its fires/s quota due at one instant and nothing else due: the burst goes in quota, the
    rest over quota, bounded only by the tenant's in-flight quota (100) — three rounds of two
    dispatchers, with the clock standing still (no second of quota is regained)."""
    start = _origin()
    clock = FakeClock(start)
    t = add_tenant(store, "over", now_us=start)
    first = _triggers(store, t, f"{sink.base_url}/ok", 3 * QUOTA, start)
    clock.set(first)
    assert _commit(store, clock) == 3 * QUOTA
    url = store_url(store)

    async def steps() -> tuple[int, Counter[str], list[int]]:
        second = Store.open(url)
        try:
            async with Dispatcher(store, clock, "d1") as d1, Dispatcher(second, clock, "d2") as d2:
                rounds = await _drain([d1, d2], store, t.id, 3 * QUOTA, max_rounds=4)
                return rounds, d1.admitted + d2.admitted, [d1.delivered, d2.delivered]
        finally:
            second.close()

    rounds, admitted, delivered = asyncio.run(steps())
    assert rounds == 3   # 100 in flight at most: 100, 100, 100
    assert admitted == Counter({"on-time": QUOTA, "over-quota": 2 * QUOTA})
    assert sum(delivered) == 3 * QUOTA and _states(store, t.id) == Counter({"delivered": 3 * QUOTA})
    assert len({r["fire_key"] for r in sink.records()}) == 3 * QUOTA


def test_a_tenant_within_its_quota_is_not_delayed_by_one_over_it(store: Store, sink: SinkServer) -> None:
    """The over-quota tenant has been sending 3 × its quota for a second (its bucket in debt); at the
    next second its 300 fires and the small tenant's 20 are due together, and each dispatcher has
    only 64 slots: the small tenant's fires all go in the first claim, as in-quota work."""
    start = _origin()
    clock = FakeClock(start)
    big = add_tenant(store, "big", now_us=start)
    small = add_tenant(store, "small", now_us=start)
    first = _triggers(store, big, f"{sink.base_url}/ok", 3 * QUOTA, start)
    clock.set(first)
    assert _commit(store, clock) == 3 * QUOTA
    url = store_url(store)

    async def steps() -> tuple[Counter[str], Counter[str], Counter[str]]:
        second = Store.open(url)
        try:
            async with Dispatcher(store, clock, "d1", concurrency=64) as d1, \
                    Dispatcher(second, clock, "d2", concurrency=64) as d2:
                await _drain([d1, d2], store, big.id, 3 * QUOTA, max_rounds=8)   # the first second
                assert _triggers(store, small, f"{sink.base_url}/ok", 20, start, now_us=first) == first + S
                clock.set(first + S)
                assert _commit(store, clock) == 3 * QUOTA + 20   # both tenants' fires of this second
                before = Counter(d1.admitted)
                assert await d1.claim_once() == 64
                first_claim = d1.admitted - before
                await d1.flush()
                small_now = _states(store, small.id)
                await _drain([d1, d2], store, big.id, 6 * QUOTA, max_rounds=12)
                return first_claim, small_now, _states(store, big.id)
        finally:
            second.close()

    first_claim, small_after_first, big_end = asyncio.run(steps())
    # The first claim of the contended second: all 20 small fires (in quota) and 44 of the big one's
    # (one more in quota as its debt ran down to the burst limit, the rest over quota).
    assert small_after_first == Counter({"delivered": 20})
    assert first_claim["on-time"] >= 20 and sum(first_claim.values()) == 64
    assert big_end == Counter({"delivered": 6 * QUOTA})
    with store.engine.read() as c:
        ph = "?" if store.engine_name == "sqlite" else "%s"
        late = c.execute(f"SELECT MAX(dispatched_us - scheduled_us) FROM fires WHERE tenant_id = {ph}",
                         (small.id,)).fetchone()[0]
    assert late == 0   # dispatched at the first claim after they were due (the clock did not move)


def _scanned(plan: Any) -> list[tuple[str, int]]:
    """(node type, rows it read: returned + removed by a filter, over all loops) of every scan node
    of an EXPLAIN (ANALYZE, FORMAT JSON) plan."""
    out = []
    if "Scan" in plan.get("Node Type", ""):
        read = int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0))
        out.append((plan["Node Type"], read * int(plan.get("Actual Loops", 1))))
    for child in plan.get("Plans", []):
        out += _scanned(child)
    return out


def test_the_postgres_claim_reads_a_bounded_batch_whatever_the_statistics(store: Store, sink: SinkServer) -> None:
    """Counted, not timed: with 600 due fires on a ``fires`` table the planner has no statistics for
    (autovacuum off, never analysed — a fresh database, as in the bench), the claim's statements
    (decision 0130) scan a bounded number of rows: the tenant walk a few index entries, the fire
    read at most ``limit`` rows of the tenant's index, and it locks ``limit`` rows."""
    if store.engine_name != "postgres":
        pytest.skip("PostgreSQL's plans (SQLite has its own count in tests/contract/test_claim_is_bounded.py)")
    start = _origin()
    clock = FakeClock(start)
    with store.engine.write() as c:
        c.execute("ALTER TABLE fires SET (autovacuum_enabled = false)")
    t = add_tenant(store, "plan", now_us=start)
    first = _triggers(store, t, f"{sink.base_url}/ok", 600, start)
    clock.set(first)
    assert _commit(store, clock) == 600
    limit = 128
    plans = {}
    with store.engine.write() as c:
        for name, params in (("dp_claim_tenants", {"lane": "on-time", "now_us": first, "start": "", "stop": "",
                                                   "scan": 257}),
                             ("dp_claim_fires", {"lane": "on-time", "now_us": first,
                                                 "batch": json.dumps([[t.id, limit]])})):
            row = c.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + store.q[name], params).fetchone()
            doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
            plans[name] = doc[0]["Plan"]
    walk = _scanned(plans["dp_claim_tenants"])
    assert walk and max(n for _, n in walk) <= 4, f"the tenant walk scanned {walk}"
    read = _scanned(plans["dp_claim_fires"])
    assert read and max(n for _, n in read) <= limit, f"the fire read scanned {read}"
    assert plans["dp_claim_fires"]["Actual Rows"] == limit
