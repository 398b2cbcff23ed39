"""The timing loop commits without a round trip per fire (issue 15 goal 5; decisions 0135, 0136): a
tick over 3 due rows and one over 60 make the same calls on the store's connections — one due read,
one read of the uncached versions (none once they are cached), and the batch's write calls — a count,
not a timing. On PostgreSQL no statement runs once per row (each write is one statement over the batch
as a JSON array); on SQLite, in process, one prepared statement is stepped per row. The fires are
all committed and the collector is on again after the tick."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from fireledger.clock import FakeClock
from fireledger.timing import TimingLoop
from storekit import add_target, add_tenant, add_trigger

MS = 1_000


class _Counting:
    def __init__(self, inner: Any, calls: list[str]) -> None:
        self._inner, self._calls = inner, calls

    def cursor(self, *a: Any, **k: Any) -> _Counting:
        return _Counting(self._inner.cursor(*a, **k), self._calls)

    def execute(self, sql: str, *a: Any, **k: Any) -> Any:
        self._calls.append(" ".join(sql.split()[:2]))
        return self._inner.execute(sql, *a, **k)

    def executemany(self, sql: str, *a: Any, **k: Any) -> Any:
        self._calls.append(" ".join(sql.split()[:2]))
        self._calls.append("(stepped per row)")   # one call, one execution per element
        return self._inner.executemany(sql, *a, **k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _counted(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    for name in ("read", "write"):
        plain = getattr(store.engine, name)

        def wrapped(plain: Any = plain) -> Any:
            @contextmanager
            def cm() -> Iterator[Any]:
                with plain() as c:
                    yield _Counting(c, calls)
            return cm()

        monkeypatch.setattr(store.engine, name, wrapped)
    return calls


def _tick_calls(store: Any, monkeypatch: pytest.MonkeyPatch, n: int) -> tuple[list[str], list[str], int]:
    t = add_tenant(store, name=f"t{n}")
    tg = add_target(store, t)
    firsts = {add_trigger(store, t, tg, {"every": "60s"})[2] for _ in range(n)}
    [first] = firsts
    assert first is not None
    clock = FakeClock(first + 5 * MS, eps_us=MS)
    loop = TimingLoop(store, clock, "node-a")
    calls = _counted(store, monkeypatch)
    cold = loop.tick()
    cold_calls = list(calls)
    assert gc.isenabled()
    clock.advance(60_000 * MS)
    calls.clear()
    warm = loop.tick()
    monkeypatch.undo()
    assert len(cold.inserted) == n and len(warm.inserted) == n
    assert {f.scheduled_us for f in cold.inserted} == {first}
    assert {f.scheduled_us for f in warm.inserted} == {first + 60_000 * MS}
    return cold_calls, list(calls), len(cold.inserted)


def test_a_tick_makes_the_same_calls_for_3_fires_or_60(store, monkeypatch):
    few_cold, few_warm, _ = _tick_calls(store, monkeypatch, 3)
    many_cold, many_warm, _ = _tick_calls(store, monkeypatch, 60)
    assert many_cold == few_cold and many_warm == few_warm
    writes = ["SAVEPOINT apply_bulk", "INSERT INTO", "UPDATE due", "RELEASE SAVEPOINT"]
    assert [c for c in many_cold if c in writes] == writes
    # PostgreSQL: no statement executed once per row (executemany is one per element on the server,
    # even pipelined); each kind of write is one statement over the batch as a JSON array.
    # SQLite (in process, no round trips) steps one prepared statement per row.
    stepped = sum(c == "(stepped per row)" for c in many_cold)
    assert stepped == (0 if store.engine_name == "postgres" else 2)
    # Cold: one more call than warm — the one read of the batch's versions.
    assert len(many_cold) == len(many_warm) + 1
    assert len(many_cold) <= 12, many_cold


def test_a_burst_is_committed_first_small_then_in_bulk(store):
    """Decision 0258: a cycle with more due rows than one batch commits the first ``batch`` (so
    dispatch starts on it, decision 0195), then ``follow_batch`` per commit — fewer, larger commits of
    the one SQLite writer — and hands each batch over after its own commit. Nothing is lost or
    decided twice; the defaults are 1,000 then 4,000."""
    t = add_tenant(store, name="burst")
    tg = add_target(store, t)
    firsts = {add_trigger(store, t, tg, {"every": "60s"})[2] for _ in range(20)}
    [first] = firsts
    assert first is not None
    handed: list[int] = []
    loop = TimingLoop(store, FakeClock(first + 5 * MS, eps_us=MS), "node-a", batch=3, follow_batch=7,
                      on_committed=lambda fires: handed.append(len(fires)))
    res = loop.tick()
    assert handed == [3, 7, 7, 3]
    assert len(res.inserted) == 20 and len({f.trigger_id for f in res.inserted}) == 20
    default = TimingLoop(store, FakeClock(first), "node-b")
    assert (default.batch, default.follow_batch) == (1000, 4000)
    assert TimingLoop(store, FakeClock(first), "node-c", batch=50, follow_batch=10).follow_batch == 50
