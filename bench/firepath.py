"""Fire-path benchmark: N one-shot triggers due at one instant, embedded default (SQLite), real
signed HTTP delivery to a local sink running in its own process.

Prints one JSON object with the keys of DESIGN.md §4: scenario, system, n, delivered, missed, early,
duplicate_records, fires_per_s (committed), delivered_per_s, lateness_p50_s/p99_s/max_s (arrival
at the sink minus scheduled instant, by the sink's clock).

    .venv/bin/python bench/firepath.py --n 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fireledger.clock import SystemClock  # noqa: E402
from fireledger.dispatch.runner import Dispatcher  # noqa: E402
from fireledger.domain.keys import from_us, to_us  # noqa: E402
from fireledger.recurrence import format_instant, parse_instant  # noqa: E402
from fireledger.store import SqlStore  # noqa: E402
from fireledger.timing import TimingLoop  # noqa: E402
from storekit import add_target, add_tenant, add_trigger  # noqa: E402

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
os.environ.setdefault("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1")   # the sink is on loopback


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def start_sink(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / "port"
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "sink.py"), "--port", "0", "--port-file",
                             str(port_file), "--secret", SECRET], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not port_file.exists() or not port_file.read_text().strip():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("sink did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"


def records(base: str) -> list[dict]:
    with urllib.request.urlopen(f"{base}/records", timeout=60) as r:
        return json.loads(r.read())


async def drive(store: SqlStore, clock: SystemClock, n: int, deadline_s: float) -> dict[str, float]:
    dispatcher = Dispatcher(store, clock, "bench-d", concurrency=256)
    commits: list[float] = []

    def committed(fires):  # called after each commit, from the timing thread
        commits.append(time.time())
        dispatcher.wake_threadsafe(loop)

    loop = asyncio.get_running_loop()
    timing = TimingLoop(store, clock, "bench-t", on_committed=committed, batch=2000)
    tasks = [asyncio.create_task(dispatcher.run()), asyncio.create_task(timing.run())]
    end = time.monotonic() + deadline_s
    while dispatcher.delivered < n and time.monotonic() < end:
        await asyncio.sleep(0.05)
    timing.stop()
    dispatcher.stop()
    await asyncio.gather(*tasks)
    return {"last_commit": max(commits) if commits else float("nan")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--lead-s", type=float, default=3.0, help="seconds from setup end to the instant")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        sink, base = start_sink(tmp)
        try:
            store = SqlStore.open(f"sqlite:///{tmp}/bench.db")
            clock = SystemClock()
            t = add_tenant(store)
            # Measure the fire path, not the default tenant quota (100 fires/s, 100 in flight).
            store.set_tenant_quota(t.id, fires_per_s=1e6, inflight=100_000)
            tg = add_target(store, t, url=f"{base}/ok", secret=SECRET)
            now = clock.now().latest_us
            # The instant: far enough ahead to create every trigger first.
            setup_est = args.n * 0.0004 + args.lead_s
            at_us = (now // 1_000_000 + int(setup_est) + 2) * 1_000_000
            spec = {"at": format_instant(from_us(at_us))}
            for _ in range(args.n):
                add_trigger(store, t, tg, spec, now_us=now)
            if clock.now().earliest_us >= at_us:
                raise RuntimeError("setup overran the instant; raise --lead-s")
            import uvloop

            out = uvloop.run(drive(store, clock, args.n, deadline_s=120 + args.n / 100))
            recs = records(base)
            count = store.count_fires()
            with store.engine.read() as c:
                attempt_results = dict(c.execute(
                    "SELECT COALESCE(result, 'unfinished') || ':' || COALESCE(error, ''), COUNT(*) "
                    "FROM attempts GROUP BY 1").fetchall())
            store.close()
        finally:
            sink.terminate()
            sink.wait()
    keys = [r["fire_key"] for r in recs]
    lat = [r["arrived_at"] - to_us(parse_instant(r["scheduled_instant"])) / 1e6 for r in recs]
    at_s = at_us / 1e6
    last_arrival = max((r["arrived_at"] for r in recs), default=float("nan"))
    result = {
        "scenario": f"firepath-burst-{args.n}",
        "system": "fireledger-sqlite",
        "n": args.n,
        "delivered": len(set(keys)),
        "missed": args.n - len(set(keys)),
        "early": sum(1 for x in lat if x < 0),
        "duplicate_records": count - args.n,
        "duplicate_deliveries": len(keys) - len(set(keys)),
        "bad_signatures": sum(1 for r in recs if not r.get("signature_ok")),
        "fires_per_s": round(args.n / max(1e-9, out["last_commit"] - at_s), 1),
        "delivered_per_s": round(len(set(keys)) / max(1e-9, last_arrival - at_s), 1),
        "lateness_p50_s": round(pct(lat, 50), 4),
        "lateness_p99_s": round(pct(lat, 99), 4),
        "lateness_max_s": round(max(lat, default=float("nan")), 4),
        "attempt_results": attempt_results,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
