"""`make falsify`: run every fault scenario; one JSON object per line per scenario.

    .venv/bin/python falsify/run.py [--quick] [--only PREFIX]

Each object carries at least ``scenario`` and ``passed`` (bool) plus the scenario's figures. The
exit code is non-zero when any scenario did not pass.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import falsify.scenarios as pkg  # noqa: E402


def discover(quick: bool) -> Iterator[tuple[str, Callable[[], dict]]]:
    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"falsify.scenarios.{mod.name}")
        fn = getattr(module, "scenarios", None)
        if fn is not None:
            yield from fn(quick)


def run_one(name: str, fn: Callable[[], dict]) -> dict:
    started = time.monotonic()
    try:
        out = dict(fn())
    except Exception as exc:  # a crashed scenario is a failed one, with its reason
        out = {"passed": False, "error": f"{type(exc).__name__}: {exc}",
               "trace": traceback.format_exc().splitlines()[-3:]}
    out = {"scenario": name, **out}
    out.setdefault("passed", False)
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="run scenarios whose name starts with this")
    args = ap.parse_args(argv)
    # One state directory for the run (KEK made as `fireledger init` makes it, key ring), shared by
    # the services scenarios start and the scenarios' in-process reads; never the checkout's.
    import shutil
    import tempfile

    from e2e import use_state_dir

    state_root = tempfile.mkdtemp(prefix="fireledger-falsify-state-")
    use_state_dir(Path(state_root) / "state")
    try:
        return _run(args)
    finally:
        shutil.rmtree(state_root, ignore_errors=True)


def _run(args: argparse.Namespace) -> int:
    ok = True
    for name, fn in discover(args.quick):
        if not name.startswith(args.only):
            continue
        res = run_one(name, fn)
        ok &= bool(res["passed"])
        print(json.dumps(res), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
