"""The dispatch plane's heap of timers behind one loop timer (decision 0235): each callback runs
once, not before its instant, in order; cancelled ones never run; one failing callback does not
stop the others; callbacks may arm and cancel timers; a heap of cancelled entries is compacted."""

from __future__ import annotations

import asyncio

from fireledger.dispatch.timers import Timers


async def _until(cond, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_callbacks_run_once_in_order_never_early_and_cancelled_ones_never() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        timers = Timers(loop)
        ran: list[tuple[str, bool]] = []
        t0 = loop.time()

        def hit(name: str, when: float) -> None:
            ran.append((name, loop.time() >= when - 0.001))   # a loop timer's own resolution: 1 ms

        for name, delay in (("c", 0.06), ("a", 0.02), ("b", 0.04), ("x", 0.03)):
            timers.call_at(t0 + delay, hit, name, t0 + delay)
        cancelled = timers.call_later(0.01, hit, "never", 0.0)
        cancelled.cancel()
        cancelled.cancel()   # idempotent
        assert len(timers) == 4
        await _until(lambda: len(ran) == 4)
        assert [n for n, _ in ran] == ["a", "x", "b", "c"] and all(ok for _, ok in ran)
        assert len(timers) == 0
        timers.close()

    asyncio.run(main())


def test_a_failing_callback_is_reported_and_the_others_still_run() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        reported: list[BaseException] = []
        loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx["exception"]))
        timers = Timers(loop)
        ran: list[str] = []

        def boom() -> None:
            raise RuntimeError("boom")

        now = loop.time()
        timers.call_at(now + 0.01, boom)
        timers.call_at(now + 0.01, ran.append, "after")
        await _until(lambda: ran == ["after"])
        assert [type(e) for e in reported] == [RuntimeError]

    asyncio.run(main())


def test_callbacks_may_arm_earlier_timers_and_cancel_others() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        timers = Timers(loop)
        ran: list[str] = []
        now = loop.time()
        late = timers.call_at(now + 0.5, ran.append, "late (cancelled)")
        timers.call_at(now + 0.2, ran.append, "far")

        def first() -> None:
            ran.append("first")
            late.cancel()
            timers.call_at(loop.time() + 0.01, ran.append, "armed by a callback")

        timers.call_at(now + 0.01, first)
        await _until(lambda: "far" in ran)
        assert ran == ["first", "armed by a callback", "far"]
        assert len(timers) == 0

    asyncio.run(main())


def test_many_cancelled_timers_are_compacted_and_the_live_ones_still_run() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        timers = Timers(loop)
        ran: list[int] = []
        now = loop.time()
        kept = [timers.call_at(now + 0.02 + i * 0.001, ran.append, i) for i in range(5)]
        for i in range(1000):
            timers.call_at(now + 30 + i, ran.append, -1).cancel()
        assert len(timers) == len(kept)
        assert len(timers._heap) <= 64 + 2 * len(kept)   # the cancelled entries did not pile up
        await _until(lambda: len(ran) == 5)
        assert ran == [0, 1, 2, 3, 4]
        timers.close()
        assert len(timers) == 0 and timers._handle is None

    asyncio.run(main())
