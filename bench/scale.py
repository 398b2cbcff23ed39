"""Scale scenario: many live triggers, few due — what an idle cycle costs, memory, start-up time.

Two stores (embedded SQLite) are bulk-loaded (``bench/load.py``): ``small`` live triggers (1,000) and
``large`` (1,000,000; ``--quick`` 100,000). In each, all but a handful are daily intervals whose next
instants lie 30+ days ahead (spread one second apart); 10 triggers fire every second; 5 one-shot
"probes" are due in the past, so the first cycle of a freshly started timing process commits them.

Measured per store:

* ``startup_s`` — ``fireledger timing --db …`` (the real timing process: loop, shadow rebuilder)
  from spawn until its first cycle has committed (the first fire row appears; polled every 20 ms);
* ``rss_mib`` / ``rss_peak_mib`` — that process's VmRSS 5 s after its first cycle, and VmHWM;
  ``cpu_share_idle`` — its CPU time over those 5 s ÷ 5 s (10 fires/s and one shadow check per second);
* ``tick_us`` — median wall time of ``TimingLoop.tick()`` over 50 idle cycles (nothing due: the
  every-second triggers were just advanced) in this process, and ``cycle_us`` = tick + the
  next-due read the loop makes after each tick (``run()``'s whole cycle);
* ``shadow_check_ms`` — median of the shadow rebuilder checking one partition (5 partitions), which
  the timing process does once a second.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from benchkit import SECRET, S, cpu_s, machine, rnd, rss_kib, say, wait_until
from fireledger.clock import SystemClock
from fireledger.domain.keys import from_us
from fireledger.recurrence import format_instant
from fireledger.store import Store
from fireledger.timing import TimingLoop
from load import compiled, load_triggers, tenant_and_target

FEW_DUE = 10
PROBES = 5


def build(db: Path, n: int) -> dict[str, Any]:
    store = Store.open(f"sqlite:///{db}")
    try:
        now = time.time_ns() // 1000
        tenant, target = tenant_and_target(store, "http://127.0.0.1:9/unused", SECRET, now)
        far0 = (now // S + 30 * 86400) * S
        spec0, _ = next(compiled([{"every": "24h", "anchor": format_instant(from_us(far0))}], now))
        probe_at = now - S
        probe_spec, _ = next(compiled([{"at": format_instant(from_us(probe_at))}], now - 2 * S))
        every = list(compiled([{"every": "1s", "anchor": format_instant(from_us(now // S * S + i * S // FEW_DUE))}
                               for i in range(FEW_DUE)], now))

        def items():  # type: ignore[no-untyped-def]
            for _ in range(PROBES):
                yield probe_spec, probe_at
            yield from every
            for i in range(n - PROBES - FEW_DUE):
                a = far0 + i * S
                yield {**spec0, "anchor": format_instant(from_us(a))}, a

        info = load_triggers(store, tenant, target, items(), now)
    finally:
        store.close()
    return info


def timing_process(db: Path, tmp: Path) -> dict[str, Any]:
    from e2e import Service
    from fireledger.store.sqlitelib import sqlite3

    svc = Service(f"sqlite:///{db}", tmp, command="timing", env={"FIRELEDGER_LOG_LEVEL": "warning"})
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        t0 = time.monotonic()
        svc.start()
        assert svc.proc is not None

        def first_cycle() -> bool:
            if svc.proc is not None and svc.proc.poll() is not None:
                raise RuntimeError(f"fireledger timing exited {svc.proc.returncode}: {svc.log_text()[-1500:]}")
            try:
                return conn.execute("SELECT COUNT(*) FROM fires").fetchone()[0] > 0
            except sqlite3.OperationalError:
                return False

        wait_until(first_cycle, 120, interval_s=0.02, what="the timing process's first cycle")
        startup = time.monotonic() - t0
        cpu0, w0 = cpu_s(svc.proc.pid), time.monotonic()
        time.sleep(5)   # a fixed observation window (not waiting for a condition)
        cpu = (cpu_s(svc.proc.pid) - cpu0) / (time.monotonic() - w0)
        mem = rss_kib(svc.proc.pid)
    finally:
        conn.close()
        svc.stop()
    return {"startup_s": startup, "rss_mib": mem["VmRSS"] / 1024, "rss_peak_mib": mem["VmHWM"] / 1024,
            "cpu_share_idle": cpu}


def in_process(db: Path) -> dict[str, Any]:
    from fireledger.timing.shadow import ShadowRebuilder

    store = Store.open(f"sqlite:///{db}")
    try:
        clock = SystemClock()
        loop = TimingLoop(store, clock, "bench-scale")
        loop.tick()   # claim whatever is due now (warms the caches too)
        ticks, cycles = [], []
        for _ in range(50):
            t0 = time.perf_counter()
            res = loop.tick()
            t1 = time.perf_counter()
            store.timing.earliest_due()
            t2 = time.perf_counter()
            if res.claimed_rows == 0:
                ticks.append((t1 - t0) * 1e6)
                cycles.append((t2 - t0) * 1e6)
        shadow = ShadowRebuilder(store, clock, "bench-scale")
        checks = []
        for p in range(5):
            t0 = time.perf_counter()
            shadow.check(p)
            checks.append((time.perf_counter() - t0) * 1e3)
    finally:
        store.close()
    return {"tick_us": statistics.median(ticks) if ticks else None,
            "cycle_us": statistics.median(cycles) if cycles else None,
            "idle_ticks": len(ticks), "shadow_check_ms": statistics.median(checks)}


def scenario(tmp: Path, large: int, small: int = 1000) -> list[dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for n in (small, large):
        db = tmp / f"scale-{n}.db"
        say(f"scale: loading {n:,} triggers")
        info = build(db, n)
        say(f"scale: {n:,} loaded in {info['load_s']:.1f}s; starting `fireledger timing`")
        proc = timing_process(db, tmp)
        say(f"scale: {n:,}: start-up {proc['startup_s']:.2f}s, RSS {proc['rss_mib']:.0f} MiB; timing ticks")
        out[n] = {"load_s": info["load_s"], **proc, **in_process(db)}
    s, big = out[small], out[large]
    ratio = big["tick_us"] / s["tick_us"] if big["tick_us"] and s["tick_us"] else None
    cratio = big["cycle_us"] / s["cycle_us"] if big["cycle_us"] and s["cycle_us"] else None
    line: dict[str, Any] = {
        "scenario": f"scale-{large}", "system": "fireledger-sqlite", "durable": True, "n": large,
        "delivered": None, "missed": None, "early": None, "duplicate_records": None, "fires_per_s": None,
        "lateness_p50_s": None, "lateness_p99_s": None, "lateness_max_s": None,
        "live_triggers": {"small": small, "large": large},
        "load_s": {"small": rnd(s["load_s"], 2), "large": rnd(big["load_s"], 2)},
        "tick_us": {"small": rnd(s["tick_us"], 1), "large": rnd(big["tick_us"], 1)},
        "cycle_us": {"small": rnd(s["cycle_us"], 1), "large": rnd(big["cycle_us"], 1)},
        "tick_ratio": rnd(ratio, 2), "cycle_ratio": rnd(cratio, 2),
        "shadow_check_ms": {"small": rnd(s["shadow_check_ms"], 2), "large": rnd(big["shadow_check_ms"], 2)},
        "startup_s": {"small": rnd(s["startup_s"], 2), "large": rnd(big["startup_s"], 2)},
        "rss_mib": {"small": rnd(s["rss_mib"], 1), "large": rnd(big["rss_mib"], 1)},
        "rss_peak_mib": {"small": rnd(s["rss_peak_mib"], 1), "large": rnd(big["rss_peak_mib"], 1)},
        "cpu_share_idle": {"small": rnd(s["cpu_share_idle"], 3), "large": rnd(big["cpu_share_idle"], 3)},
        "targets": {"cycle_ratio_le_2": cratio is not None and cratio <= 2,
                    "rss_le_1GiB": big["rss_peak_mib"] <= 1024, "startup_le_10s": big["startup_s"] <= 10},
        **machine()}
    return [line]
