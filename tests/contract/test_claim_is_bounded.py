"""A claim reads a bounded amount of the store whatever the backlog (issue 15, decision 0130).

Not a timed test: a count. One claim (``claim_shaped`` with a shaper that admits nothing, so the
store is unchanged), then one that leases 256 fires (the dispatcher's shaper and default slots), are
measured over a backlog of 1,000 due fires and again once the backlog is 20,000 due fires (the extra
19,000 *older* than the first, so an index read in order meets them first); what each read may not
grow by more than half.

What is counted, per engine:
- SQLite: virtual-machine steps of every statement the claim runs on this thread's connection
  (``set_progress_handler(counter, 1)``: the handler runs once per VM instruction), the reads before
  its write transaction included;
- PostgreSQL: the rows every plan node of every ``SELECT`` / ``WITH`` statement of the claim
  produced (actual rows × loops, summed over the nodes), from ``EXPLAIN (ANALYZE, FORMAT JSON)`` run
  on the same statement with the same parameters just before it, in the claim's own transaction.
  (Buffers are no measure here: a whole-backlog ranking that switches to a sequential scan touches
  fewer pages at 20,000 fires than an index plan at 1,000 while it reads twenty times the rows.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fireledger.dispatch.lanes import DispatchConfig
from fireledger.dispatch.runner import _Shaper
from fireledger.dispatch.shaping import Capacity
from fireledger.domain.dispatch_records import Settlement, ShapedDecision
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
TENANTS = 3
TRIGGERS = 10   # per tenant
SMALL, LARGE = 1_000, 20_000
#: A dispatcher's default window (2 × 256 free slots + 16, see dispatch/runner.py ``_fetch``).
WINDOW = 528
#: A dispatcher's default free slots (FIRELEDGER_DISPATCH_CONCURRENCY 256).
SLOTS = Capacity(256, {"on-time": 256, "catch-up": 0, "backfill": 0}, 128)


class Offered:
    """A shaper that admits nothing and remembers how many candidates it was offered."""

    def __init__(self) -> None:
        self.offered = 0

    def bucket_keys(self, candidates: Any) -> list[str]:
        return []

    def decide(self, snapshot: Any) -> ShapedDecision:
        self.offered = sum(len(v) for v in snapshot.candidates.values())
        return ShapedDecision([], {})


def _put(store: Any, trig: Any, instants: range) -> None:
    """Commit due fires for ``trig`` in one batch (the timing plane's bulk insert path)."""
    fires = tuple(NewFire(trig.tenant_id, trig.id, us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                          us, "2026f", "t") for us in instants)
    row = store.registry.get_trigger(trig.tenant_id, trig.id)
    [o] = store.timing.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), fires)])
    assert len(o.inserted) == len(fires)


def _rows(node: dict[str, Any]) -> int:
    """Rows a plan node and its children read: produced, and removed by a filter (counts per loop)."""
    read = sum(int(node.get(k, 0)) for k in ("Actual Rows", "Rows Removed by Filter",
                                            "Rows Removed by Index Recheck", "Rows Removed by Join Filter"))
    return read * int(node.get("Actual Loops", 1)) + sum(_rows(child) for child in node.get("Plans", ()))


class _Explaining:
    """A PostgreSQL connection that runs ``EXPLAIN (ANALYZE, FORMAT JSON)`` of each statement before
    running it, adding the rows its plan nodes read to ``tally["rows"]``; a write is explained inside
    a savepoint rolled back at once, so only the real statement changes anything."""

    def __init__(self, conn: Any, tally: dict[str, int]) -> None:
        self._conn = conn
        self._tally = tally

    def explain(self, sql: str, params: Any) -> None:
        write = not sql.lstrip().upper().startswith(("SELECT", "WITH"))
        if write:
            self._conn.execute("SAVEPOINT explain_only")
        [[plan]] = self._conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()
        if write:
            self._conn.execute("ROLLBACK TO SAVEPOINT explain_only")
        self._tally["rows"] += _rows((plan if isinstance(plan, dict) else json.loads(plan))["Plan"])
        self._tally["statements"] += 1

    def execute(self, sql: str, params: Any = None) -> Any:
        if not sql.lstrip().upper().startswith(("SAVEPOINT", "RELEASE", "ROLLBACK")):
            self.explain(sql, params)
        return self._conn.execute(sql, params)

    def cursor(self) -> Any:
        return _ExplainingCursor(self, self._conn.cursor())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _ExplainingCursor:
    def __init__(self, conn: _Explaining, cur: Any) -> None:
        self._explaining = conn
        self._cur = cur

    def executemany(self, sql: str, params: Any) -> Any:
        params = list(params)
        for p in params:
            self._explaining.explain(sql, p)
        return self._cur.executemany(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


def _claim_cost(store: Any, now_us: int, shaper: Any) -> tuple[int, Any]:
    """(what one claim read, its ``ClaimResult``)."""
    if store.engine_name == "sqlite":
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        conn = store.engine.connection()
        conn.set_progress_handler(count, 1)
        try:
            res = store.dispatch.claim_shaped(now_us, "probe", {"on-time": WINDOW}, shaper, 5 * S)
        finally:
            conn.set_progress_handler(None, 1)
        return steps[0], res
    with store.engine.connection().cursor() as cur:
        cur.execute("ANALYZE fires")   # as autovacuum would: the plans of a table with statistics
    tally = {"rows": 0, "statements": 0}
    engine = store.engine
    plain_write, plain_read = engine.write, engine.read

    @contextmanager
    def write() -> Iterator[Any]:
        with plain_write() as c:
            yield _Explaining(c, tally)

    @contextmanager
    def read() -> Iterator[Any]:
        with plain_read() as c:
            yield _Explaining(c, tally)

    engine.write, engine.read = write, read
    try:
        res = store.dispatch.claim_shaped(now_us, "probe", {"on-time": WINDOW}, shaper, 5 * S)
    finally:
        del engine.write, engine.read   # back to the class's methods
    assert tally["statements"] > 0
    return tally["rows"], res


def _lease_cost(store: Any, now_us: int) -> tuple[int, int]:
    """What a claim that leases (the dispatcher's shaper, its default slots) read, and how many
    fires it leased; they are then settled (delivered), so every measurement starts with nothing in
    flight (a claim reads the tenants' attempts in flight too: bounded by their quota, not the
    backlog, but not what this test compares)."""
    cost, res = _claim_cost(store, now_us, _Shaper(DispatchConfig(), SLOTS))
    oks = store.dispatch.settle_dispatch([Settlement(j.job, "delivered", 200, None, "delivered", None, None)
                                 for j in res.jobs], now_us)
    assert all(oks)
    return cost, len(res.jobs)


def test_one_claim_reads_a_bounded_amount_whatever_the_backlog(store):
    triggers = []
    for i in range(TENANTS):
        t = add_tenant(store, f"t{i}")
        tg = add_target(store, t)
        triggers += [add_trigger(store, t, tg, {"every": "60s"})[0] for _ in range(TRIGGERS)]
    small, large = SMALL // len(triggers), LARGE // len(triggers)
    now = T0 + (large + 10) * S
    for trig in triggers:   # the newest `small` instants of each trigger …
        _put(store, trig, range(T0 + (large - small) * S, T0 + large * S, S))
    for t in {trig.tenant_id for trig in triggers}:
        store.dispatch.set_tenant_quota(t, fires_per_s=1e6, inflight=100_000)
    offer = Offered()
    cost_small, _ = _claim_cost(store, now, offer)
    offered_small = offer.offered
    lease_small, leased_small = _lease_cost(store, now)
    for trig in triggers:   # … then every older one: the backlog is now 20 times larger
        _put(store, trig, range(T0, T0 + (large - small) * S, S))
    cost_large, _ = _claim_cost(store, now, offer)
    offered_large = offer.offered
    lease_large, leased_large = _lease_cost(store, now)
    assert offered_small == offered_large == WINDOW and leased_small == leased_large == SLOTS.total
    assert cost_small > 0 and lease_small > 0
    figures = (f"{store.engine_name}: a claim read {cost_small} at {SMALL} due fires and {cost_large} at {LARGE}; "
               f"one that leased {SLOTS.total}: {lease_small} and {lease_large} (VM steps / plan rows)")
    print(figures)
    assert cost_large <= 1.5 * cost_small, figures
    assert lease_large <= 1.5 * lease_small, figures
