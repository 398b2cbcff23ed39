"""The timing plane's CPU per fire under a steady stream of instants, by gather window (decision 0150).

    PYTHONPATH=src .venv/bin/python bench/timing_pace.py [--rate 1000] [--seconds 5] [--gather 0,0.01]

``rate`` interval triggers of 1 s, anchored evenly over the second (a distinct instant every
1/rate s, as the ``cost`` scenario loads them), on a fresh SQLite store; for each gather window the
real ``TimingLoop.run()`` (system clock, no dispatch, WAL checkpoints on their own thread as
``serve`` runs them) decides them for ``seconds``. One JSON line per window: the process's CPU time
(all threads) per fire committed, fires per cycle, cycles per second, and the decision lateness
(``decided_us - scheduled_us``) p50/p99 — what the window costs in punctuality. The windows run one
after another in this process, each on its own store, in the order given (repeat one to see the
noise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import SECRET, S, machine
from fireledger.clock import SystemClock
from fireledger.domain.keys import from_us
from fireledger.recurrence import format_instant
from fireledger.store import Store
from fireledger.store.engine import SqliteEngine
from fireledger.timing import TimingLoop
from load import compiled, load_triggers, tenant_and_target


def _pct(xs: list[int], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, math.ceil(q * len(s)) - 1)] / 1e6, 4)


def one(tmp: Path, rate: int, seconds: int, gather_s: float) -> dict[str, Any]:
    """One window's line (module docstring)."""
    store = Store.open(f"sqlite:///{tmp / f'pace-{time.monotonic_ns()}.db'}", migrate=True)
    assert isinstance(store.engine, SqliteEngine)
    store.engine.start_checkpointer()
    try:
        now = time.time_ns() // 1000
        tenant, target = tenant_and_target(store, "http://127.0.0.1:9/unused", SECRET, now)
        base = (now // S + 2) * S
        specs = ({"every": "1s", "anchor": format_instant(from_us(base + i * S // rate))} for i in range(rate))
        load_triggers(store, tenant, target, compiled(specs, now), now)
        cycles = [0]
        loop = TimingLoop(store, SystemClock(), "bench-pace", gather_s=gather_s)
        tick = loop.tick

        def counted() -> Any:
            cycles[0] += 1
            return tick()

        loop.tick = counted   # type: ignore[method-assign]

        async def run() -> tuple[float, int, list[int]]:
            task = asyncio.create_task(loop.run())
            await asyncio.sleep(max(0.0, (base + S) / 1e6 - time.time()))   # warm: the first second
            c0, n0, k0 = time.process_time(), len(loop.lateness_us), cycles[0]
            await asyncio.sleep(seconds)
            cpu, ks, lat = time.process_time() - c0, cycles[0] - k0, loop.lateness_us[n0:]
            loop.stop()
            await task
            return cpu, ks, lat

        cpu, ks, lat = asyncio.run(run())
        fires = len(lat)
    finally:
        store.close()
    return {"scenario": "timing-pace", "rate": rate, "seconds": seconds, "gather_s": gather_s,
            "fires": fires, "cycles_per_s": round(ks / seconds, 1),
            "fires_per_cycle": round(fires / ks, 2) if ks else None,
            "cpu_us_per_fire": round(cpu * 1e6 / fires, 1) if fires else None,
            "cpu_us_per_cycle": round(cpu * 1e6 / ks, 1) if ks else None,
            "decided_lateness_p50_s": _pct(lat, 0.5), "decided_lateness_p99_s": _pct(lat, 0.99), **machine()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--gather", default="0,0.01", help="comma-separated gather windows in seconds")
    a = ap.parse_args()
    from e2e import use_state_dir  # a state directory (KEK) for sealing the bench target's secret

    use_state_dir(Path(tempfile.mkdtemp(prefix="fireledger-pace-state-")) / "state")
    with tempfile.TemporaryDirectory(prefix="fireledger-pace-") as d:
        for g in (float(x) for x in a.gather.split(",")):
            print(json.dumps(one(Path(d), a.rate, a.seconds, g)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
