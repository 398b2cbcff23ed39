"""Fire-path benchmark on its own: N one-shot triggers due at one instant on the embedded default
(``fireledger serve`` on SQLite), real signed HTTP delivery to the benchmark sink in its own process.
The same run as the suite's ``burst-N`` line for fireledger (see ``bench/fl.py`` and
docs/performance.md); ``--profile`` records it under py-spy and adds the top frames.

    .venv/bin/python bench/firepath.py --n 10000 [--profile]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import Sink, emit


def main() -> int:
    import fl

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--deadline-s", type=float, default=None, help="give up this long after the instant")
    ap.add_argument("--profile", action="store_true", help="record the serve process with py-spy")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fireledger-firepath-") as d:
        tmp = Path(d)
        sink = Sink(tmp)
        try:
            emit(fl.burst(sink, tmp, f"burst-{a.n}", a.n, deadline_s=a.deadline_s or 60 + a.n / 100,
                          profile=a.profile))
        finally:
            sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
