"""A claim holds the store's write transaction for its SQL only (decision 0257): the jobs it hands to
the attempt runner — one :class:`~fireledger.domain.model.DispatchJob` per leased fire — are built
after the commit. On SQLite the writer is one for every process (the timing plane's commits and
every dispatcher's claims queue on it), so Python work inside it delays all of them.

Both claim paths (``claim_shaped`` and ``settle_and_claim``), on both engines: every job is built
outside :meth:`Engine.write`, and the jobs are still exactly the leased fires, each as leased
(``dispatching``, attempt 1, its lease end as its next attempt).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from fireledger.dispatch.lanes import DispatchConfig
from fireledger.dispatch.runner import _Shaper
from fireledger.dispatch.shaping import Capacity
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from fireledger.store import dispatch as store_dispatch
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
SLOTS = Capacity(64, {"on-time": 64, "catch-up": 0, "backfill": 0}, 64)


def _due_fires(store: Any, n: int) -> None:
    t = add_tenant(store, "t1")
    tg = add_target(store, t)
    trig = add_trigger(store, t, tg, {"every": "60s"})[0]
    store.dispatch.set_tenant_quota(t.id, fires_per_s=1e6, inflight=10_000)
    fires = tuple(NewFire(t.id, trig.id, T0 + i * S, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                          T0 + i * S, "2026f", "t") for i in range(n))
    row = store.registry.get_trigger(t.id, trig.id)
    store.timing.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), fires)])


@pytest.fixture
def built_inside(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For every DispatchJob the store builds: whether a write transaction was open at the time."""
    depth = [0]
    seen: list[bool] = []
    write = store.engine.write

    @contextmanager
    def counted() -> Iterator[Any]:
        depth[0] += 1
        try:
            with write() as c:
                yield c
        finally:
            depth[0] -= 1

    real = store_dispatch.DispatchJob

    def job(*a: Any, **k: Any) -> Any:
        seen.append(depth[0] > 0)
        return real(*a, **k)

    monkeypatch.setattr(store.engine, "write", counted)
    monkeypatch.setattr(store_dispatch, "DispatchJob", job)
    return seen


def test_claimed_jobs_are_built_after_the_commit(store: Any, built_inside: list[bool]) -> None:
    _due_fires(store, 30)
    now = T0 + 100 * S
    shaper = _Shaper(DispatchConfig(), SLOTS)
    first = store.dispatch.claim_shaped(now, "runner-a", {"on-time": 10}, shaper, 5 * S)
    assert len(first.jobs) == 10
    settled = [Settlement(j.job, "delivered", 200, None, "delivered", None, None) for j in first.jobs]
    oks, second = store.dispatch.settle_and_claim(settled, now, "runner-a", {"on-time": 10}, shaper, 5 * S)
    assert oks == [True] * 10 and len(second.jobs) == 10
    assert len(built_inside) == 20
    assert not any(built_inside), "a DispatchJob was built while the write transaction was open"
    keys = set()
    for claimed in first.jobs + second.jobs:
        f = claimed.job.fire
        assert f.state == FireState.DISPATCHING and f.attempts == 1 and claimed.job.attempt == 1
        assert claimed.job.lease_owner == "runner-a" and f.next_attempt_us == claimed.job.lease_expires_us
        assert f.dispatched_us == now
        keys.add((f.trigger_id, f.scheduled_us))
    assert len(keys) == 20   # twenty distinct fires, none leased twice
