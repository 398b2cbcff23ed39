"""fireledger.security.flight.once (decision 0206): one load per key at a time on a loop, its outcome
shared with every caller that arrived meanwhile; nothing kept once it finished."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fireledger.security.flight import once


def _gated() -> tuple[threading.Event, list[int], object]:
    """A load that blocks its worker thread until the gate opens and counts its runs."""
    gate = threading.Event()
    runs: list[int] = []

    def load() -> int:
        runs.append(1)
        assert gate.wait(10), "the test never opened the gate"
        return len(runs)

    return gate, runs, load


async def _until(cond: object, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not cond():   # type: ignore[operator]
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0)   # yield to the loop (no fixed wait)


def test_callers_arriving_during_a_load_share_it() -> None:
    async def main() -> None:
        gate, runs, load = _gated()
        callers = [asyncio.ensure_future(once("k", load)) for _ in range(50)]   # type: ignore[arg-type]
        await _until(lambda: runs, "the load to start")
        gate.set()
        results = await asyncio.gather(*callers)
        assert runs == [1] and results == [1] * 50
        assert await once("k", lambda: "again") == "again"   # finished: the next caller loads anew

    asyncio.run(main())


def test_different_keys_load_separately() -> None:
    async def main() -> None:
        seen: list[str] = []
        got = await asyncio.gather(*(once(k, lambda k=k: seen.append(k) or k) for k in ("a", "b", "a")))
        assert sorted(got) == ["a", "a", "b"]
        assert sorted(set(seen)) == ["a", "b"]

    asyncio.run(main())


def test_a_failed_load_is_raised_to_every_waiter_and_not_kept() -> None:
    async def main() -> None:
        gate = threading.Event()
        calls: list[int] = []

        def boom() -> None:
            calls.append(1)
            gate.wait(10)
            raise LookupError("store down")

        waiters = [asyncio.ensure_future(once("k", boom)) for _ in range(5)]
        await _until(lambda: calls, "the load to start")
        gate.set()
        outcomes = await asyncio.gather(*waiters, return_exceptions=True)
        assert calls == [1]
        assert all(isinstance(o, LookupError) for o in outcomes)
        assert await once("k", lambda: 7) == 7

    asyncio.run(main())


def test_a_cancelled_waiter_does_not_cancel_the_load_for_the_others() -> None:
    async def main() -> None:
        gate, runs, load = _gated()
        first = asyncio.ensure_future(once("k", load))   # type: ignore[arg-type]
        second = asyncio.ensure_future(once("k", load))   # type: ignore[arg-type]
        await _until(lambda: runs, "the load to start")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        gate.set()
        assert await second == 1 and runs == [1]

    asyncio.run(main())



def test_a_load_left_behind_by_a_closed_loop_does_not_stick() -> None:
    """A loop closed while its load ran leaves its entry behind; a later loop that happens to get
    the same id loads anew instead of awaiting the dead loop's future."""
    from fireledger.security import flight

    dead = asyncio.new_event_loop()
    stale = dead.create_future()   # never finished: its loop is closed below
    dead.close()

    async def again() -> object:
        flight._LOADING[(id(asyncio.get_running_loop()), "k")] = stale   # as if the id were reused
        return await once("k", lambda: "fresh")

    assert asyncio.run(again()) == "fresh"
