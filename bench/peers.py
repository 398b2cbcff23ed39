"""The peers as systems under test: APScheduler 3.11 (``.venv``, the ``bench`` extra) and APScheduler
4.0 alpha (``.venv-bench4``, from ``bench/requirements-aps4.txt``), each in its own process running
``peer_aps3.py`` / ``peer_aps4.py`` against the shared sink, on the same workload as fireledger.

``missed`` counts fires that never reached the sink (whatever the reason); the scheduler's own
outcome counts (executed / missed / error …) are reported beside it under ``scheduler_outcomes``.
``duplicate_records`` is the sink's duplicate arrivals (the peers keep no record per fire).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchkit import BENCH, ROOT, S, Sink, machine, say, summarise

VENV4 = ROOT / ".venv-bench4"


@dataclass(frozen=True)
class Peer:
    system: str
    runner: str           # peer_aps3.py | peer_aps4.py
    store: str            # memory | sqlite
    setup_s_per_job: float   # adding one job/schedule (measured, generous), for the lead time
    durable: bool
    start_s: float = 3.0     # the runner's start-up before its first job is added, for the lead time

    def python(self) -> Path | None:
        if self.runner == "peer_aps3.py":
            try:
                import apscheduler  # noqa: F401
            except ImportError:
                return None
            return Path(sys.executable)
        py = VENV4 / "bin" / "python"
        return py if py.exists() else None

    def unavailable(self) -> str | None:
        if self.python() is None:
            return ("APScheduler 3 is not installed (pip install -e '.[bench]')" if self.runner == "peer_aps3.py"
                    else "APScheduler 4 venv missing (make bench creates .venv-bench4 from "
                         "bench/requirements-aps4.txt)")
        return None


PEERS = [
    Peer("apscheduler3-memory", "peer_aps3.py", "memory", 0.0001, False),
    Peer("apscheduler3-sqlite", "peer_aps3.py", "sqlite", 0.0008, True),
    # APScheduler 4's runner imports more (anyio, its own venv): 3 s overran on a loaded machine, and
    # the retry with twice the lead cost a whole run (decision 0214).
    Peer("apscheduler4-memory", "peer_aps4.py", "memory", 0.0001, False, start_s=4.0),
    Peer("apscheduler4-sqlite", "peer_aps4.py", "sqlite", 0.008, True, start_s=4.0),
]
LEAD_FACTOR = 1.25   # lead = start_s + jobs × cost × this; the whole lead doubled for the one retry of an overrun
KEYS = ("n", "delivered", "missed", "early", "duplicate_records", "fires_per_s", "lateness_p50_s",
        "lateness_p99_s", "lateness_max_s")


def skipped(scenario: str, peer: Peer, reason: str, n: int) -> dict[str, Any]:
    line: dict[str, Any] = {"scenario": scenario, "system": peer.system, "durable": peer.durable}
    line.update({k: None for k in KEYS})
    line["n"] = n
    line["skipped"] = reason
    return line


def _lead(peer: Peer, jobs: int, factor: float) -> float:
    """Seconds from now to the first instant: the runner's start-up and ``jobs`` schedules added
    (× :data:`LEAD_FACTOR`), all of it scaled up for a retry (``factor`` above it)."""
    return (peer.start_s + jobs * peer.setup_s_per_job * LEAD_FACTOR) * factor / LEAD_FACTOR


def _events(cmd: list[str], err_path: Path, timeout_s: float) -> tuple[dict[str, Any], str, int | None]:
    """Run a peer runner and read its events as they come: ``(events by name, stderr, exit code)``.
    A runner whose ``ready`` says its set-up overran the first instant is stopped at once (the run is
    invalid and will be retried: waiting for its late fires only cost wall time; decision 0214); one
    that outlives ``timeout_s`` is killed."""
    events: dict[str, Any] = {}
    with open(err_path, "w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=str(BENCH))
        timer = threading.Timer(max(1.0, timeout_s), proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    ev = json.loads(line)
                    events[ev["event"]] = ev
                except (ValueError, KeyError, TypeError):
                    continue
                if ev.get("event") == "ready" and (ev.get("margin_s") or 0) < 0:
                    proc.kill()
                    break
            proc.wait()
        finally:
            timer.cancel()
        err.seek(0)
        return events, err.read(), proc.returncode


def _run(peer: Peer, sink: Sink, tmp: Path, scenario: str, args: list[str], *, n: int, t0_us: int,
         window: tuple[int, int], end_us: int) -> dict[str, Any]:
    sink.clear()
    db = tmp / f"{peer.system}-{scenario}-{time.monotonic_ns()}.db"   # a retry must not find the killed run's jobs
    cmd = [str(peer.python()), str(BENCH / peer.runner), "--sink", sink.url, "--store", peer.store,
           "--db", str(db), "--end-at-us", str(end_us), *args]
    events, err, returncode = _events(cmd, tmp / f"{peer.system}-{scenario}.err",
                                      timeout_s=(end_us - time.time_ns() // 1000) / S + 60)
    result: dict[str, Any] = {"scenario": scenario, "system": peer.system, "durable": peer.durable}
    if "ready" not in events:
        result.update({k: None for k in KEYS})
        result["n"] = n
        result["error"] = f"runner failed (exit {returncode}): {err.strip()[-600:]}"
        return result
    summary = summarise(sink.records(), n, t0_us=t0_us, window=window)
    summary["duplicate_records"] = summary["duplicate_deliveries"]
    result.update(summary)
    done = events.get("done", {})
    result.update({"complete": bool(done.get("complete")), "scheduler_outcomes": done.get("outcomes"),
                   "setup_s": events["ready"]["setup_s"], "setup_margin_s": events["ready"]["margin_s"],
                   "sink": sink.stats(), **machine()})
    if events["ready"]["margin_s"] < 0:
        result["invalid"] = "setup overran the first instant"
    if returncode:
        result["runner_exit"] = returncode
        result["runner_stderr"] = err.strip()[-600:]
    return result


def burst(peer: Peer, sink: Sink, tmp: Path, scenario: str, n: int, *, deadline_s: float,
          grace: str = "none", factor: float = LEAD_FACTOR) -> dict[str, Any]:
    reason = peer.unavailable()
    if reason:
        return skipped(scenario, peer, reason, n)
    now = time.time_ns() // 1000
    lead = _lead(peer, n, factor)
    at = (now // S + math.ceil(lead)) * S
    say(f"{peer.system} {scenario}: {n} jobs, grace {grace}; the instant in {lead:.0f}s")
    line = _run(peer, sink, tmp, scenario, ["--mode", "burst", "--n", str(n), "--at-us", str(at), "--grace", grace],
                n=n, t0_us=at, window=(at, at + 1), end_us=at + int(deadline_s * S))
    line.update({"deadline_s": deadline_s, "misfire_grace": grace})
    if line.get("invalid") and factor == LEAD_FACTOR:
        say(f"{peer.system} {scenario}: setup overran the instant; once more with twice the lead")
        return burst(peer, sink, tmp, scenario, n, deadline_s=deadline_s, grace=grace, factor=2 * factor)
    return line


def steady(peer: Peer, sink: Sink, tmp: Path, scenario: str, rate: int, duration_s: int, *,
           drain_s: float = 10, factor: float = LEAD_FACTOR) -> dict[str, Any]:
    reason = peer.unavailable()
    if reason:
        return skipped(scenario, peer, reason, rate * duration_s)
    now = time.time_ns() // 1000
    lead = _lead(peer, rate, factor)
    base = (now // S + math.ceil(lead)) * S
    end = base + duration_s * S
    say(f"{peer.system} {scenario}: {rate} interval jobs, {duration_s}s; first instant in {lead:.0f}s")
    line = _run(peer, sink, tmp, scenario, ["--mode", "steady", "--rate", str(rate), "--base-us", str(base),
                                            "--duration-s", str(duration_s)],
                n=rate * duration_s, t0_us=base, window=(base, end), end_us=end + int(drain_s * S))
    line.update({"rate": rate, "duration_s": duration_s, "misfire_grace": "none"})
    if line.get("invalid") and factor == LEAD_FACTOR:
        say(f"{peer.system} {scenario}: setup overran the first instant; once more with twice the lead")
        return steady(peer, sink, tmp, scenario, rate, duration_s, drain_s=drain_s, factor=2 * factor)
    return line
