"""One ``tenant-overload`` run (``bench/overload.py``), one summary line: a single (topology,
receiver, N) of the scenario alone, for A/B runs of one source tree against another (``PYTHONPATH``).

    PYTHONPATH=src python bench/overload_once.py sqlite-serve stdlib-http-server 300 10

Arguments: topology (``sqlite-serve``, ``postgres-serve``, ``postgres-split``), receiver
(``bench-sink``, ``stdlib-http-server``), N triggers of 1 s, seconds of fires (the quick form's 10 by
default; the drain after the window is the quick form's 5 s).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

KEYS = ("topology", "receiver", "n", "delivered", "lateness_p50_s", "lateness_p99_s", "lateness_max_s",
        "unknown_attempts", "attempt_results", "fires_per_s")


def main() -> int:
    from e2e import use_state_dir

    use_state_dir(Path(tempfile.mkdtemp(prefix="fireledger-bench-state-")) / "state")
    import overload
    from benchkit import Stores

    if len(sys.argv) < 4 or sys.argv[1] not in overload.TOPOLOGIES or sys.argv[2] not in overload.RECEIVERS:
        raise SystemExit(__doc__)
    topology, receiver, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    duration_s = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    load = Path("/proc/loadavg").read_text().split()[0]
    with tempfile.TemporaryDirectory(prefix="fireledger-overload-once-") as d:
        tmp = Path(d)
        stores = Stores(tmp)
        try:
            url, _ = stores.fresh(topology, f"overload-{receiver}-{n}")
            line = overload.one(topology, receiver, url, tmp, n, duration_s, drain_s=5.0)
        finally:
            stores.close()
    print(json.dumps({"load": load, **{k: line.get(k) for k in KEYS}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
