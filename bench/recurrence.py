"""Micro-benchmark of the recurrence compiler: cost of one ``next_after`` call.

Prints ONE JSON object::

    {"tzdata_version": "2026f", "zone": "Europe/London", "calls": ..., "batches": ...,
     "*/5 * * * *": {"us_median": ..., "us_p99": ..., "cronsim_us_median": ..., "ratio_vs_cronsim": ...,
                     "wall_bisect_us_median": ..., "cronsim_naive_us_median": ...,
                     "dst_label_us_median": ..., "dst_label_year_setup_ms": ...},
     ...}

* ``us_median`` — median over batches of the mean cost of one ``next_after`` call (chained: each
  call starts from the previous result), in microseconds; ``us_p99`` — 99th percentile of single calls.
* ``cronsim_us_median`` — the same for cronsim alone stepping an aware iterator in the zone (its own,
  different, DST handling); ``ratio_vs_cronsim`` = ``us_median / cronsim_us_median``.
* ``wall_bisect_us_median`` / ``cronsim_naive_us_median`` — the naive wall-time search alone:
  our bisect ``WallMatcher.next_wall`` against cronsim stepping a naive iterator.
* ``dst_label_us_median`` — one ``dst_label`` call (decision 0160: the timing loop labels every cron
  fire it decides), cycling over the chain's first ``calls`` instants (those near a transition
  included), in the steady state: each zone-year's offset changes are computed once, before
  (``dst_label_year_setup_ms``: that one-time cost for one zone-year).

Usage: ``.venv/bin/python bench/recurrence.py [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

from cronsim import CronSim

from fireledger.recurrence import TZDATA_VERSION, compile_cron, dst_label, load_zone, next_after, preview
from fireledger.recurrence.cron import WallMatcher

EXPRESSIONS = ["*/5 * * * *", "0 9 * * 1-5", "30 2 * * *"]
ZONE = "Europe/London"
START = datetime(2026, 1, 1, tzinfo=UTC)  # a year's chain crosses both London transitions


def measure(steps: dict[str, Callable[[], object]], calls: int, batches: int) -> dict[str, tuple[float, float]]:
    """Per contender: (median over batches of the mean per-call µs, p99 of single-call µs).

    Batches of the contenders are interleaved, so that a busy machine slows them alike.
    """
    clock = time.perf_counter_ns
    means: dict[str, list[float]] = {name: [] for name in steps}
    singles: dict[str, list[int]] = {name: [] for name in steps}
    for step in steps.values():  # warm-up
        for _ in range(calls // 10):
            step()
    gc.disable()
    try:
        for _ in range(batches):
            for name, step in steps.items():
                batch: list[int] = []
                for _ in range(calls):
                    t0 = clock()
                    step()
                    batch.append(clock() - t0)
                means[name].append(sum(batch) / len(batch) / 1000)
                singles[name].extend(batch)
    finally:
        gc.enable()
    out = {}
    for name in steps:
        one = sorted(singles[name])
        out[name] = (statistics.median(means[name]), one[min(len(one) - 1, int(len(one) * 0.99))] / 1000)
    return out


def bench_expression(expr: str, calls: int, batches: int) -> dict[str, float]:
    rec = compile_cron(expr, ZONE)
    state = {"after": START}

    def ours() -> None:
        nxt = next_after(rec, state["after"])
        assert nxt is not None
        state["after"] = nxt

    aware = CronSim(expr, START.astimezone(load_zone(ZONE)))
    matcher = WallMatcher(expr)
    wall = {"t": START.replace(tzinfo=None)}

    def bisect_wall() -> None:
        wall["t"] = matcher.next_wall(wall["t"])

    naive = CronSim(expr, START.replace(tzinfo=None))
    chain = [o.instant for o in preview(rec, START, calls)]
    for instant in chain:       # steady state: each zone-year's offset changes computed once, first
        dst_label(rec, instant)
    at = {"i": 0}

    def label() -> None:
        dst_label(rec, chain[at["i"] % len(chain)])
        at["i"] += 1

    r = measure(
        {"ours": ours, "cronsim": lambda: next(aware), "bisect": bisect_wall, "naive": lambda: next(naive),
         "label": label},
        calls, batches,
    )
    return {
        "us_median": round(r["ours"][0], 2),
        "us_p99": round(r["ours"][1], 2),
        "cronsim_us_median": round(r["cronsim"][0], 2),
        "ratio_vs_cronsim": round(r["ours"][0] / r["cronsim"][0], 2),
        "wall_bisect_us_median": round(r["bisect"][0], 2),
        "cronsim_naive_us_median": round(r["naive"][0], 2),
        "dst_label_us_median": round(r["label"][0], 2),
        "dst_label_year_setup_ms": round(_year_setup_ms(), 2),
    }


def _year_setup_ms() -> float:
    """The one-time cost of a zone-year's offset changes (``recurrence.dst._changes``), in ms."""
    from fireledger.recurrence import dst

    dst._CHANGES.clear()
    t0 = time.perf_counter()
    dst._changes(load_zone(ZONE), 2031)
    return (time.perf_counter() - t0) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and batches (a smoke run)")
    args = parser.parse_args(argv)
    calls, batches = (200, 5) if args.quick else (2000, 15)
    result: dict[str, object] = {"tzdata_version": TZDATA_VERSION, "zone": ZONE, "calls": calls, "batches": batches}
    for expr in EXPRESSIONS:
        result[expr] = bench_expression(expr, calls, batches)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
