"""The timing plane's batched commit (decision 0135), on real SQLite and PostgreSQL.

``apply_decisions`` commits a batch with one statement per kind of write — the fires, the due rows
advanced, the due rows retired — whatever the batch's size (a count of the calls the store makes on
its connection, not a timing), and keeps every contract of the row-by-row path when a batch meets a
fire decided elsewhere or a due row that moved: exactly one record per key, a moved row's fires
removed again, the others committed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000


def _fire(trig: Any, at: int, node: str = "n1") -> NewFire:
    return NewFire(trig.tenant_id, trig.id, at, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                   at + 5, "2026f", node, eps_us=1000, eps_source="declared")


def _triggers(store: Any, n: int) -> tuple[Any, list[tuple[Any, int]]]:
    t = add_tenant(store)
    tg = add_target(store, t)
    out = []
    for _ in range(n):
        trig, _, first = add_trigger(store, t, tg, {"every": "60s"})
        assert first is not None
        out.append((trig, first))
    return t, out


def _each_moves_on(trigs: list[tuple[Any, int]]) -> list[Decision]:
    return [Decision(Advance(trig.id, first, 1, first + 60 * S, 1), (_fire(trig, first),)) for trig, first in trigs]


class _Counting:
    """A connection (or cursor) whose ``execute``/``executemany`` calls are counted: on PostgreSQL
    each is a round trip, on SQLite a statement the driver prepares and steps."""

    def __init__(self, inner: Any, calls: list[str]) -> None:
        self._inner, self._calls = inner, calls

    def cursor(self, *a: Any, **k: Any) -> _Counting:
        return _Counting(self._inner.cursor(*a, **k), self._calls)

    def execute(self, sql: str, *a: Any, **k: Any) -> Any:
        self._calls.append(sql.split()[0])
        self._inner.execute(sql, *a, **k)
        return self

    def executemany(self, sql: str, *a: Any, **k: Any) -> Any:
        self._calls.append(sql.split()[0] + " per row")   # one call, one execution per element
        return self._inner.executemany(sql, *a, **k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _count_writes(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    plain = store.engine.write

    @contextmanager
    def counted() -> Iterator[Any]:
        with plain() as c:
            yield _Counting(c, calls)

    monkeypatch.setattr(store.engine, "write", counted)
    return calls


@pytest.mark.parametrize("n", [3, 120])
def test_a_batch_commits_with_one_statement_per_kind_of_write(store, monkeypatch, n):
    t, trigs = _triggers(store, n)
    retire = trigs[: n // 3]   # some schedules end with this instant, the rest move on
    decisions = [Decision(Advance(trig.id, first, 1, None if (trig, first) in retire else first + 60 * S, 1),
                          (_fire(trig, first),)) for trig, first in trigs]
    calls = _count_writes(store, monkeypatch)
    outcomes = store.timing.apply_decisions(decisions)
    assert [o.trigger_id for o in outcomes] == [trig.id for trig, _ in trigs]
    assert all(o.advanced and len(o.inserted) == 1 for o in outcomes)
    # SAVEPOINT, fires, advances, retires, RELEASE — the same five calls for 3 decisions or 120. On
    # PostgreSQL each write is ONE statement over the batch (executemany would run one per element on
    # the server, pipelined or not); on SQLite, in process, one prepared statement stepped per element.
    # On PostgreSQL one more: the batch's single `pg_notify('fireledger_fires', n)` (decision 0221),
    # sent after the savepoint is released, inside the transaction (so only a commit delivers it).
    per_row = " per row" if store.engine_name == "sqlite" else ""
    notify = ["SELECT"] if store.engine_name == "postgres" else []
    assert calls == ["SAVEPOINT", f"INSERT{per_row}", f"UPDATE{per_row}", f"DELETE{per_row}", "RELEASE", *notify]
    due = {r.trigger_id: r.next_us for r in store.timing.due_index()}
    for trig, first in trigs:
        assert due.get(trig.id) == (None if (trig, first) in retire else first + 60 * S)
        assert [f.scheduled_us for f in store.history.list_fires(t.id, trig.id)] == [first]


def test_a_fire_decided_elsewhere_sends_the_batch_row_by_row(store):
    t, trigs = _triggers(store, 6)
    trig2, first2 = trigs[2]
    # Another decider committed this fire (its advance not yet visible): the key exists.
    store.timing.insert_fires([_fire(trig2, first2, node="other")])
    decisions = _each_moves_on(trigs)
    outcomes = store.timing.apply_decisions(decisions)
    assert all(o.advanced for o in outcomes)
    assert [len(o.inserted) for o in outcomes] == [1, 1, 0, 1, 1, 1]
    for trig, first in trigs:
        fires = store.history.list_fires(t.id, trig.id)
        assert [(f.scheduled_us, f.decided_by) for f in fires] == [(first, "other" if trig is trig2 else "n1")]


def test_a_moved_due_row_loses_only_its_own_fires(store):
    t, trigs = _triggers(store, 5)
    trig1, first1 = trigs[1]
    # The row moved after the batch was planned (an amendment, another decider).
    [moved] = store.timing.apply_decisions([Decision(Advance(trig1.id, first1, 1, first1 + 60 * S, 1), ())])
    assert moved.advanced
    decisions = _each_moves_on(trigs)
    outcomes = store.timing.apply_decisions(decisions)
    assert [o.advanced for o in outcomes] == [True, False, True, True, True]
    assert outcomes[1].inserted == ()
    assert store.history.list_fires(t.id, trig1.id) == []
    for trig, first in trigs[:1] + trigs[2:]:
        assert [f.scheduled_us for f in store.history.list_fires(t.id, trig.id)] == [first]


def test_the_batched_fire_records_carry_every_column(store):
    t, [(trig, first)] = _triggers(store, 1)
    smeared = NewFire(trig.tenant_id, trig.id, first, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                      first + 5, "2026f", "n1", not_before_us=first + 700, eps_us=1234, eps_source="kernel")
    skipped = NewFire(trig.tenant_id, trig.id, first - 60 * S, 0, 1, FireKind.CATCH_UP, Lane.CATCH_UP,
                      FireState.SKIPPED, first + 5, "2026f", "n1", "skipped: a cause", eps_us=1234,
                      eps_source="kernel")
    [o] = store.timing.apply_decisions([Decision(Advance(trig.id, first, 1, first + 60 * S, 1), (skipped, smeared))])
    assert o.advanced and o.inserted == (skipped, smeared)
    got = {f.scheduled_us: f for f in store.history.list_fires(t.id, trig.id)}
    live, quiet = got[first], got[first - 60 * S]
    assert (live.state, live.lane, live.kind, live.decided_us, live.tzdata_version) == \
        (FireState.PENDING, Lane.ON_TIME, FireKind.SCHEDULED, first + 5, "2026f")
    assert live.next_attempt_us == first + 700 and live.finished_us is None and live.attempts == 0
    assert (live.eps_us, live.eps_source) == (1234, "kernel")
    assert (quiet.state, quiet.cause, quiet.finished_us, quiet.next_attempt_us) == \
        (FireState.SKIPPED, "skipped: a cause", first + 5, None)
