"""Where the dispatch plane's CPU goes per delivery (issue 15 item 4; decision 0209): the attempt
runner of ``bench/dispatch.py`` (one tenant, 100 triggers, N fires due at once, real signed HTTP with
per-attempt tokens to the sink in its own process, SQLite) with the store thread's work timed by
section in thread CPU time.

Prints one JSON object: ``cpu_us_per_attempt`` (this process: event loop + store thread), and per
delivered fire ``store_us`` (the store thread's dispatch transactions, commits included),
``claim_us`` (the claim, of which ``claim_candidates_us``, ``claim_shaper_us``,
``claim_lease_us``), ``settle_us`` (recording the results) and ``event_loop_us`` (the rest: the
trust gate, body, token, signature, HTTP, bookkeeping), with ``claims``, ``settles`` and
``store_calls`` (transactions: since decision 0233 a settlement usually shares the next claim's,
and ``claim_us``/``settle_us`` are then measured inside it, without the commit) and the load
average at the start.

    PYTHONPATH=src python bench/dispatch_cpu.py [--n 5000]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dispatch as bench
from fireledger.dispatch import settling
from fireledger.dispatch.credentials import KeyRingFile
from fireledger.store import dispatch as store_dispatch

CPU: collections.Counter[str] = collections.Counter()
CALLS: collections.Counter[str] = collections.Counter()
CPU_ALIAS: dict[str, str] = {}


def _timed(owner: Any, name: str, label: str) -> None:
    """Wrap ``owner.name`` so the thread CPU time spent in it adds to ``CPU[label]``."""
    orig: Callable[..., Any] = getattr(owner, name)

    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.thread_time()
        try:
            return orig(*a, **k)
        finally:
            CPU[label] += time.thread_time() - t
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def main() -> int:
    import uvloop

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000)
    n = ap.parse_args().n
    combined = hasattr(store_dispatch.SqlDispatch, "settle_and_claim")   # decision 0233
    # The store thread's dispatch calls, each a whole transaction (commit included): ``store_us``.
    for name in ("claim_shaped", "settle_dispatch", "settle_and_claim"):
        if hasattr(store_dispatch.SqlDispatch, name):
            _timed(store_dispatch.SqlDispatch, name, "store" if combined else name)
    if combined:   # the claim and the settlement inside their transactions (without the commit)
        _timed(store_dispatch.SqlDispatch, "_claim_in", "claim")
        _timed(store_dispatch.SqlDispatch, "_settle_in", "settle")
    else:
        CPU_ALIAS.update({"claim_shaped": "claim", "settle_dispatch": "settle"})
    _timed(store_dispatch.SqlDispatch, "_ranked_candidates", "claim_candidates")
    _timed(store_dispatch.SqlDispatch, "_lease", "claim_lease")
    _timed(settling._Shaper, "decide", "claim_shaper")
    _timed(settling._Shaper, "bucket_keys", "claim_shaper")
    load = Path("/proc/loadavg").read_text().split()[0]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        from e2e import use_state_dir

        use_state_dir(tmp / "state")
        sink, base = bench.start_sink(tmp)
        try:
            store, due = bench.setup(tmp, base, n, "cpu")
            run = uvloop.run(bench.drain(store, KeyRingFile(tmp / "keys.json"), n, due))
            store.close()
        finally:
            sink.terminate()
            sink.wait(timeout=10)
    done = max(1, int(run["delivered"]))
    for old, new in CPU_ALIAS.items():   # before decision 0233 the public calls are the sections
        CPU["store"] += CPU[old]
        CALLS["store"] += CALLS[old]
        CPU[new], CALLS[new] = CPU.pop(old), CALLS.pop(old)
    per = {k: round(v * 1e6 / done, 1) for k, v in CPU.items()}
    total = run["cpu_s"] * 1e6 / done
    out = {"scenario": "dispatch-cpu", "n": n, "delivered": done, "wall_s": round(run["wall_s"], 2),
           "cpu_us_per_attempt": round(total, 1), **{f"{k}_us": v for k, v in sorted(per.items())},
           "event_loop_us": round(total - per.get("store", 0), 1),
           "claims": CALLS["claim"], "settles": CALLS["settle"], "store_calls": CALLS["store"],
           "load_average": float(load)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
