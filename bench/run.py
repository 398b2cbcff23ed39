"""`make bench`: run every benchmark, one JSON object per line per scenario.

    .venv/bin/python bench/run.py [--quick]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    runs = [
        [str(HERE / "recurrence.py"), *(["--quick"] if quick else [])],
        [str(HERE / "firepath.py"), "--n", "1000"],
    ]
    if not quick:
        runs.append([str(HERE / "firepath.py"), "--n", "10000"])
    runs.append([str(HERE / "dispatch.py"), *(["--n", "1000"] if quick else [])])
    if (HERE / "credentials.py").exists():
        runs.append([str(HERE / "credentials.py")])
    rc = 0
    for args in runs:
        proc = subprocess.run([sys.executable, *args], stdout=subprocess.PIPE, text=True)
        sys.stdout.write(proc.stdout)
        sys.stdout.flush()
        rc |= proc.returncode
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
