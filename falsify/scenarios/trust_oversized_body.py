"""``trust-oversized-body`` — issue 13, high #3 on real processes: an unauthenticated client streams
a 200 MiB chunked body (generated, never held) at a console route and at ``/v1`` of a running
``fireledger serve``, again and again on several connections, while interval triggers keep firing
into a real sink.

Passes when every such request is answered ``413`` problem+json long before its body was sent, the
fires keep being delivered during the attack and after it, and the resident memory of the serve
process stays bounded (``VmRSS`` read from ``/proc/<pid>/status`` before, during and after).
Figures: requests refused, the most body any of them got to send, deliveries before/during/after,
RSS before/peak/after.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
BODY = 200 * MiB
#: The most RSS may grow over the attack (the old tree buffered each body whole: +200 MiB a request).
RSS_BOUND = 64 * MiB
#: The most body a refused request may have sent: the 1 MiB limit plus socket and server buffers.
SENT_BOUND = 24 * MiB


def rss_bytes(pid: int) -> int:
    """``VmRSS`` of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def oversized_body(run_s: float, connections: int) -> dict[str, Any]:
    from bodykit import send_chunked
    from e2e import Api, Service, new_tenant, verify_target, wait_until
    from sink import SinkServer

    work = Path(tempfile.mkdtemp(prefix="trust-oversized-"))
    db = f"sqlite:///{work}/fl.db"
    failures: list[str] = []
    sink = SinkServer()
    sink.start_in_thread()
    svc = Service(db, work).start()
    try:
        assert svc.proc is not None and svc.port is not None
        pid, port = svc.proc.pid, svc.port
        _, token = new_tenant(db)
        api = Api(svc.base, token)
        target = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/ok"}, 201)
        sink.add_secret(target["secret"])
        verify_target(api, sink, target)
        for i in range(3):
            api.ok("POST", "/v1/triggers", {"name": f"steady-{i}", "schedule": {"every": "1s"},
                                            "target_id": target["id"]}, 201)
        wait_until(lambda: len(sink.records()) >= 6, 30, "the steady triggers to deliver")
        rss_before = rss_bytes(pid)
        delivered_before = len(sink.records())

        results: list[dict[str, Any]] = []
        lock = threading.Lock()
        stop = threading.Event()
        peak = [rss_before]

        def attacker(path: str, headers: dict[str, str]) -> None:
            while not stop.is_set():
                try:
                    out = send_chunked(port, "POST", path, headers, BODY, timeout_s=60)
                except OSError as exc:
                    out = {"status": 0, "sent": 0, "finished": False, "error": type(exc).__name__}
                out.pop("body", None)
                out["path"] = path
                with lock:
                    results.append(out)

        def sampler() -> None:
            while not stop.wait(0.05):
                peak[0] = max(peak[0], rss_bytes(pid))

        form = {"Content-Type": "application/x-www-form-urlencoded"}
        json_h = {"Content-Type": "application/json"}
        threads = [threading.Thread(target=sampler, daemon=True)]
        for i in range(connections):
            path, headers = [("/console/login", form), ("/console/logout", form), ("/v1/triggers", json_h)][i % 3]
            threads.append(threading.Thread(target=attacker, args=(path, headers), daemon=True))
        started = time.time()
        for t in threads:
            t.start()
        deadline = time.monotonic() + run_s
        wait_until(lambda: time.monotonic() >= deadline, run_s + 5, "the attack window", interval_s=0.1)
        stop.set()
        for t in threads:
            t.join(timeout=90)
        ended = time.time()
        records = sink.records()
        during = sum(1 for r in records if started <= r["arrived_at"] <= ended)
        rss_after_attack = rss_bytes(pid)
        wait_until(lambda: sum(1 for r in sink.records() if r["arrived_at"] > ended) >= 3, 30,
                   "deliveries after the attack")
        after = sum(1 for r in sink.records() if r["arrived_at"] > ended)

        by_path: dict[str, list[int]] = {}
        for r in results:
            by_path.setdefault(r["path"], []).append(int(r["status"]))
        most_sent = max((int(r["sent"]) for r in results), default=0)
        if not results:
            failures.append("no oversized request completed")
        for path in ("/console/login", "/v1/triggers"):
            statuses = by_path.get(path, [])
            if not statuses or any(s != 413 for s in statuses):
                failures.append(f"{path}: answered {sorted(set(statuses))}, not only 413")
        if any(r["finished"] for r in results):
            failures.append("a 200 MiB body was read to the end")
        if most_sent > SENT_BOUND:
            failures.append(f"a refused request got to send {most_sent} bytes (bound {SENT_BOUND})")
        expected_during = int(3 * (ended - started) * 0.5)
        if during < max(1, expected_during):
            failures.append(f"only {during} deliveries during the {ended - started:.1f} s attack "
                            f"(3 triggers every second; expected ≥ {expected_during})")
        growth = max(peak[0], rss_after_attack) - rss_before
        if growth > RSS_BOUND:
            failures.append(f"serve's RSS grew by {growth / MiB:.1f} MiB (bound {RSS_BOUND / MiB:.0f} MiB)")
        return {
            "passed": not failures, "failures": failures,
            "requests_refused": sum(1 for r in results if r["status"] == 413),
            "requests": len(results), "statuses": {p: sorted(set(s)) for p, s in by_path.items()},
            "body_planned_mib": BODY // MiB, "most_sent_mib": round(most_sent / MiB, 2),
            "attack_s": round(ended - started, 1), "connections": connections,
            "delivered_before": delivered_before, "delivered_during": during, "delivered_after": after,
            "rss_before_mib": round(rss_before / MiB, 1), "rss_peak_mib": round(peak[0] / MiB, 1),
            "rss_after_mib": round(rss_after_attack / MiB, 1),
        }
    finally:
        svc.stop()
        sink.stop()


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "trust-oversized-body", (lambda: oversized_body(3.0, 3)) if quick else (lambda: oversized_body(20.0, 6))
