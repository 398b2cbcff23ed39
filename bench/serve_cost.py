"""What one ``serve`` start and stop costs, idle, as the test suite starts it (``tests/e2e.py``'s
``Service``): seconds from the start to ``/healthz``, CPU seconds of ``serve`` and its dispatch children
over a hold of ``--hold`` seconds, and seconds from SIGTERM (to the process group, as ``Service.stop``)
to exit. Runs alternate ``FIRELEDGER_DISPATCH_PROCESSES=1`` with the default (decision 0239) so both
see the same load; one JSON line per run, then the medians.

    PYTHONPATH=src python bench/serve_cost.py --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def one(tmp: Path, processes: str | None, hold_s: float) -> dict[str, float | str]:
    """Start ``serve`` on a fresh store, hold it ``hold_s``, stop it; the timings of that run."""
    from e2e import Service
    from fl import _cpu_s

    svc = Service(f"sqlite:///{tmp}/fl-{time.monotonic_ns()}.db", tmp)
    svc.env.pop("FIRELEDGER_DISPATCH_PROCESSES", None)
    if processes is not None:
        svc.env["FIRELEDGER_DISPATCH_PROCESSES"] = processes
    t0 = time.monotonic()
    svc.start(timeout_s=60)
    healthy_s = time.monotonic() - t0
    assert svc.proc is not None
    time.sleep(hold_s)   # a fixed idle hold: the CPU of the start and of idling, counted the same for both
    cpu_s = _cpu_s(svc.proc.pid)
    t1 = time.monotonic()
    os.killpg(svc.proc.pid, signal.SIGTERM)
    svc.proc.wait(timeout=30)
    stop_s = time.monotonic() - t1
    svc.stop()
    return {"processes": processes or "default", "healthy_s": round(healthy_s, 3), "cpu_s": round(cpu_s, 3),
            "stop_s": round(stop_s, 3), "load": float(Path("/proc/loadavg").read_text().split()[0])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--hold", type=float, default=2.0, help="idle seconds between healthy and SIGTERM")
    a = ap.parse_args()
    from e2e import use_state_dir

    use_state_dir(Path(tempfile.mkdtemp(prefix="fireledger-bench-state-")) / "state")
    runs: dict[str, list[dict[str, float | str]]] = {"1": [], "default": []}
    with tempfile.TemporaryDirectory(prefix="fireledger-serve-cost-") as d:
        for i in range(a.rounds):
            for p in (("1", None) if i % 2 == 0 else (None, "1")):
                line = one(Path(d), p, a.hold)
                runs[str(line["processes"])].append(line)
                print(json.dumps(line), flush=True)
    for name, lines in runs.items():
        med = {k: round(statistics.median(float(x[k]) for x in lines), 3) for k in ("healthy_s", "cpu_s", "stop_s")}
        print(json.dumps({"processes": name, "median": med, "rounds": len(lines)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
