"""fireledger on PostgreSQL split planes as a system of the ``steady`` group (issue 15, goal 3):
``fireledger control`` + two ``fireledger dispatch`` + one ``fireledger timing`` (separate processes,
as ``bench/overload.py`` and ``bench/cost.py`` start them) on the bench's throwaway **durable**
PostgreSQL server (``benchkit.Stores(durable=True)``: ``fsync``, ``synchronous_commit`` and
``full_page_writes`` on; a fresh database per run, copied from a migrated template).

The workload is ``bench/fl.py``'s ``steady``: one tenant with its quota out of the way, one verified
HTTP target (the shared bench sink), ``rate`` interval triggers of 1 s anchored evenly over the
second for ``duration_s`` seconds, bulk-loaded after the planes started, the first instant a little
after the load ends. The line has ``bench/fl.py``'s keys (the ledger read from PostgreSQL), with
``planes_cpu_us_per_fire`` (every plane's CPU, user + system, over the window and drain, per fire
delivered) in place of ``serve_cpu_us_per_fire`` and the server's ``pg_settings``.

One server serves every run of the group (:meth:`Steady.close` stops it).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from benchkit import SECRET, Planes, S, Sink, Stores, failed_line, load_stream, machine, say, summarise
from fireledger.store import Store
from fl import ledger_facts, watch_window
from load import tenant_and_target

TOPOLOGY = "postgres-split"
SYSTEM = f"fireledger-{TOPOLOGY}"
ROLES = ["control", "dispatch", "dispatch", "timing"]


class Steady:
    """``steady`` runs on PostgreSQL split planes: callable as ``run(name, rate, duration_s, drain_s)``
    (``bench/run.py``'s steady runners); the PostgreSQL server starts on the first run."""

    def __init__(self, sink: Sink, tmp: Path) -> None:
        self.sink = sink
        self.tmp = tmp
        self.stores = Stores(tmp, durable=True)

    def __call__(self, scenario: str, rate: int, duration_s: int, drain_s: float) -> dict[str, Any]:
        try:
            line = self._run(scenario, rate, duration_s, drain_s)
        except Exception as exc:   # one failed run is a line, not the end of the group
            line = {**failed_line(scenario, TOPOLOGY, rate * duration_s, exc), "rate": rate,
                    "duration_s": duration_s}
        line["pg_settings"] = self.stores.pg_settings()
        return line

    def _run(self, scenario: str, rate: int, duration_s: int, drain_s: float) -> dict[str, Any]:
        sink = self.sink
        sink.clear()
        url, _ = self.stores.fresh(TOPOLOGY, scenario)
        now = time.time_ns() // 1000
        store = Store.open(url)
        try:
            tenant, target = tenant_and_target(store, sink.url, SECRET, now)
        finally:
            store.close()
        t0 = time.monotonic()
        planes = Planes(url, self.tmp, ROLES)
        start_s = time.monotonic() - t0
        try:
            base = (time.time_ns() // 1000 // S + math.ceil(2 + rate * 0.0003)) * S
            end = base + duration_s * S
            info = load_stream(url, tenant, target, rate, base, end, spread=True)
            loaded = time.time_ns() // 1000
            say(f"{SYSTEM} {scenario}: planes up in {start_s:.1f}s, {info['triggers']} triggers loaded in "
                f"{info['load_s']:.1f}s; first instant in {(base - loaded) / S:.1f}s, {duration_s}s of fires")
            n = rate * duration_s
            wait = _wait(url, planes, sink, n, (base, end), end + int(drain_s * S))
        finally:
            planes.stop()
        facts = ledger_facts(url, (base, end))
        summary = summarise(sink.records(), n, t0_us=base, window=(base, end))
        line = {"scenario": scenario, "system": SYSTEM, "topology": TOPOLOGY, "roles": ROLES, "durable": True,
                **summary, "duplicate_records": facts["records"] - facts["distinct"],
                "ledger_records": facts["records"], "states": facts["states"], "attempts": facts["attempts"],
                "ledger_lateness_s": facts["ledger_lateness_s"], "setup_margin_s": round((base - loaded) / S, 3),
                "planes_start_s": round(start_s, 1), **wait, "rate": rate, "duration_s": duration_s,
                "sink": sink.stats(), **machine()}
        line["committed_all_s"] = (round((wait["committed_all_us"] - base) / S, 2)
                                   if wait["committed_all_us"] else None)
        del line["committed_all_us"]
        if base < loaded:
            line["invalid"] = "setup overran the first instant"
        return line

    def close(self) -> None:
        """Stop the PostgreSQL server (if a run started it)."""
        self.stores.close()


def _wait(url: str, planes: Planes, sink: Sink, n: int, window: tuple[int, int], until_us: int) -> dict[str, Any]:
    """Wait for ``n`` deliveries (or ``until_us``): :func:`fl.watch_window` over the planes' processes."""
    committed, cpu = watch_window(url, list(planes.pids), sink, n, window, until_us)
    got = sink.count()
    return {"complete": got >= n, "committed_all_us": committed[0] if committed else None,
            "planes_cpu_us_per_fire": round(cpu * S / max(1, got), 1)}
