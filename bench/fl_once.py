"""One fireledger ``serve`` run on SQLite, one summary line: the suite's burst or steady scenario
(``bench/fl.py``) alone, for A/B runs of one source tree against another (``PYTHONPATH``) or of
``FIRELEDGER_DISPATCH_PROCESSES`` 1 against the default (``min(usable cores, 2)``, decision 0239; the
bench never sets it). The CPU per fire counts ``serve``'s dispatch child processes too.

    PYTHONPATH=src python bench/fl_once.py burst 10000
    FIRELEDGER_DISPATCH_PROCESSES=1 PYTHONPATH=src python bench/fl_once.py steady 2000 10
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

KEYS = ("system", "dispatch_processes", "scenario", "n", "delivered", "missed", "early", "duplicate_records",
        "fires_per_s", "lateness_p50_s", "lateness_p99_s", "serve_cpu_us_per_fire", "committed_all_s")


def main() -> int:
    from e2e import use_state_dir

    use_state_dir(Path(tempfile.mkdtemp(prefix="fireledger-bench-state-")) / "state")
    import fl
    from benchkit import Sink

    if len(sys.argv) < 3 or sys.argv[1] not in ("burst", "steady"):
        raise SystemExit(__doc__)
    load = Path("/proc/loadavg").read_text().split()[0]
    with tempfile.TemporaryDirectory(prefix="fireledger-fl-once-") as d:
        tmp = Path(d)
        sink = Sink(tmp)
        try:
            if sys.argv[1] == "burst":
                n = int(sys.argv[2])
                line = fl.burst(sink, tmp, f"burst-{n}", n, deadline_s=60 + n / 100)
            else:
                rate, seconds = int(sys.argv[2]), int(sys.argv[3])
                line = fl.steady(sink, tmp, f"steady-{rate}", rate, seconds, drain_s=5)
        finally:
            sink.close()
    out = {k: line.get(k) for k in KEYS}
    out["pythonpath"] = os.environ.get("PYTHONPATH", "")
    out["load_average"] = float(load)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
