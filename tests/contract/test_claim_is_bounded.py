"""A claim reads a bounded amount of the store whatever the backlog (issue 15, decision 0130).

Not a timed test: a count. One claim (``claim_shaped`` with a shaper that admits nothing, so the
store is unchanged) is measured over a backlog of 1,000 due fires and again once the backlog is
20,000 due fires (the extra 19,000 *older* than the first, so an index read in order meets them
first); what it read may not grow by more than half.

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

from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from fireledger.store.dispatching import ShapedDecision
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
TENANTS = 3
TRIGGERS = 10   # per tenant
SMALL, LARGE = 1_000, 20_000
#: A dispatcher's default window (2 × 256 free slots + 16, see dispatch/runner.py ``_fetch``).
WINDOW = 528


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
    row = store.get_trigger(trig.tenant_id, trig.id)
    [o] = store.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), fires)])
    assert len(o.inserted) == len(fires)


def _rows(node: dict[str, Any]) -> int:
    """Rows a plan node and its children produced (actual rows are per loop)."""
    own = int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
    return own + sum(_rows(child) for child in node.get("Plans", ()))


class _Explaining:
    """A PostgreSQL connection that runs ``EXPLAIN (ANALYZE, FORMAT JSON)`` of each read before
    running it, adding the rows its plan nodes produced to ``tally["rows"]``."""

    def __init__(self, conn: Any, tally: dict[str, int]) -> None:
        self._conn = conn
        self._tally = tally

    def execute(self, sql: str, params: Any = None) -> Any:
        if sql.lstrip().upper().startswith(("SELECT", "WITH")):
            [[plan]] = self._conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()
            self._tally["rows"] += _rows((plan if isinstance(plan, dict) else json.loads(plan))["Plan"])
            self._tally["statements"] += 1
        return self._conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _claim_cost(store: Any, now_us: int) -> tuple[int, int]:
    """(what one claim read, candidates it offered)."""
    shaper = Offered()
    if store.engine_name == "sqlite":
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        conn = store.engine.connection()
        conn.set_progress_handler(count, 1)
        try:
            store.claim_shaped(now_us, "probe", {"on-time": WINDOW}, shaper, 5 * S)
        finally:
            conn.set_progress_handler(None, 1)
        return steps[0], shaper.offered
    with store.engine.connection().cursor() as cur:
        cur.execute("ANALYZE fires")   # as autovacuum would: plans from current statistics
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
        store.claim_shaped(now_us, "probe", {"on-time": WINDOW}, shaper, 5 * S)
    finally:
        del engine.write, engine.read   # back to the class's methods
    assert tally["statements"] > 0
    return tally["rows"], shaper.offered


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
    cost_small, offered_small = _claim_cost(store, now)
    for trig in triggers:   # … then every older one: the backlog is now 20 times larger
        _put(store, trig, range(T0, T0 + (large - small) * S, S))
    cost_large, offered_large = _claim_cost(store, now)
    assert offered_small == offered_large == WINDOW
    assert cost_small > 0
    assert cost_large <= 1.5 * cost_small, (
        f"a claim read {cost_large} (VM steps / plan rows) over {LARGE} due fires against {cost_small} over {SMALL} "
        f"({store.engine_name})")
