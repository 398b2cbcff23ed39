"""``tenant-overload``: one tenant over its fires/s quota on an otherwise idle plane (issue 15).

One tenant with the **default quota** (100 fires/s, 100 in flight), one verified HTTP target, N
interval triggers of 1 s (``jitter: 0s``, all anchored at one instant: N fires due at each whole
second — the harder shape, and the one that starved on split planes) for D seconds, on

* ``sqlite-serve``   — ``fireledger serve`` on SQLite (the embedded default);
* ``postgres-serve`` — ``fireledger serve`` on a throwaway PostgreSQL server;
* ``postgres-split`` — ``fireledger control`` + two ``fireledger dispatch`` + one ``fireledger timing``
  on PostgreSQL (separate processes),

each against (i) the bench sink (``bench/sink.py``: accepts everything) and (ii) the standard
library's ``ThreadingHTTPServer`` with its default accept backlog of 5 (``bench/stdlib_receiver.py``).
One JSON line per (store, receiver, N): the in-window fires ``n``, ``delivered`` and
``delivered_fraction``, lateness percentiles, ``unknown_attempts`` (attempts recorded ``unknown``),
the ledger's states, and ``fires_per_s`` — the delivery rate reached (first arrivals per second from
the start of the window to the last one). Decision 0031 (and 0120) says the quota is *soft*: over-quota
work is served from capacity left over, so on an idle plane every fire is delivered.

Full: N ∈ {100, 300, 1000, 3000}, D = 60 s, every store × receiver; ``--quick``: N = 300 on
``sqlite-serve`` and ``postgres-serve`` (both receivers), D = 10 s (``bench/forms.py``; decision 0214).
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchkit import (
    BENCH,
    SECRET,
    Planes,
    S,
    Sink,
    Stores,
    failed_line,
    load_stream,
    machine,
    roles_for,
    say,
    summarise,
    wait_until,
)
from fireledger.store import Store

SCENARIO = "tenant-overload"
TOPOLOGIES = ("sqlite-serve", "postgres-serve", "postgres-split")
RECEIVERS = ("bench-sink", "stdlib-http-server")
#: seconds from the end of the set-up to the first instant, at least (the load takes ~0.1 s at N = 300
#: and the timing plane re-reads due rows within 0.5 s; ``setup_margin_s`` on each line says what was left)
LEAD_S = 2


class StdlibReceiver(Sink):
    """``bench/stdlib_receiver.py`` in its own process; the same admin reads as the bench sink."""

    def __init__(self, tmp: Path, backlog: int | None = None) -> None:
        port_file = tmp / f"stdlib-{time.monotonic_ns()}.port"
        extra = [] if backlog is None else ["--backlog", str(backlog)]
        self.proc = subprocess.Popen([sys.executable, str(BENCH / "stdlib_receiver.py"), "--port", "0",
                                      "--port-file", str(port_file), *extra], stdout=subprocess.DEVNULL)
        wait_until(lambda: port_file.exists() or self.proc.poll() is not None, 20, what="the receiver to listen")
        if self.proc.poll() is not None:
            raise RuntimeError("the stdlib receiver did not start")
        self.base = f"http://127.0.0.1:{port_file.read_text().strip()}"
        self.url = f"{self.base}/hook"


class Plane:
    """A fresh store with one default-quota tenant and target, and the processes of one topology."""

    def __init__(self, topology: str, url: str, tmp: Path, receiver_url: str) -> None:
        from storekit import add_target, add_tenant

        self.url = url
        now = time.time_ns() // 1000
        store = Store.open(url)
        try:
            self.tenant = add_tenant(store, "overload", now_us=now)   # the default quota: 100/s, 100 in flight
            self.target = add_target(store, self.tenant, url=receiver_url, secret=SECRET, now_us=now)
        finally:
            store.close()
        self.planes = Planes(url, tmp, roles_for(topology, ["control", "dispatch", "dispatch", "timing"]))

    def load(self, n: int, base_us: int, end_us: int, spread: bool = False) -> dict[str, Any]:
        """``n`` triggers of 1 s from ``base_us`` to ``end_us``: anchored evenly over the second, or
        all at ``base_us`` (``spread=False``: ``n`` fires due at each whole second)."""
        return load_stream(self.url, self.tenant, self.target, n, base_us, end_us, spread=spread)

    def stop(self) -> None:
        self.planes.stop()


def ledger(url: str, window: tuple[int, int]) -> dict[str, Any]:
    """States, records and attempts (by result) of the fires scheduled in ``window``."""
    store = Store.open(url)
    ph = "?" if store.engine_name == "sqlite" else "%s"
    where = f"scheduled_us >= {ph} AND scheduled_us < {ph}"
    try:
        with store.engine.read() as c:
            rec, distinct = c.execute(f"SELECT COUNT(*), COUNT(DISTINCT trigger_id || ':' || scheduled_us) "
                                      f"FROM fires WHERE {where}", window).fetchone()
            states = dict(c.execute(f"SELECT state, COUNT(*) FROM fires WHERE {where} GROUP BY state",
                                    window).fetchall())
            results = dict(c.execute(f"SELECT COALESCE(result, 'open'), COUNT(*) FROM attempts WHERE {where} "
                                     "GROUP BY COALESCE(result, 'open')", window).fetchall())
    finally:
        store.close()
    return {"records": int(rec), "distinct": int(distinct), "states": {str(k): int(v) for k, v in states.items()},
            "attempt_results": {str(k): int(v) for k, v in results.items()}}


def one(topology: str, receiver_kind: str, url: str, tmp: Path, n: int, duration_s: int,
        drain_s: float) -> dict[str, Any]:
    """One run: start the receiver and the planes, load, wait for the window plus ``drain_s``, read."""
    with ExitStack() as stack:
        own = tmp / f"rx-{time.monotonic_ns()}"   # the sink's port file is named per directory
        own.mkdir()
        rx: Sink = Sink(own) if receiver_kind == "bench-sink" else StdlibReceiver(own)
        stack.callback(rx.close)
        plane = Plane(topology, url, tmp, rx.url)
        stack.callback(plane.stop)
        base = (time.time_ns() // S // 1000 + math.ceil(LEAD_S + n * 0.0003)) * S
        end = base + duration_s * S
        info = plane.load(n, base, end)
        loaded = time.time_ns() // 1000
        total = n * duration_s
        say(f"{SCENARIO} {topology} {receiver_kind} N={n}: {info['triggers']} triggers loaded in "
            f"{info['load_s']:.1f}s; first instant in {(base - loaded) / S:.1f}s, {duration_s}s of fires")
        deadline = end + int(drain_s * S)
        try:
            wait_until(lambda: rx.count() >= total or time.time_ns() // 1000 > deadline,
                       (deadline - time.time_ns() // 1000) / S + 30, interval_s=0.1, what="deliveries")
        except TimeoutError:
            pass
        plane.stop()
        summary = summarise(rx.records(), total, t0_us=base, window=(base, end))
        facts = ledger(url, (base, end))
    line = {"scenario": SCENARIO, "system": f"fireledger-{topology}", "store": topology.split("-")[0],
            "topology": topology, "receiver": receiver_kind, "triggers": n, "duration_s": duration_s,
            "quota_fires_per_s": 100, **summary,
            "delivered_fraction": round(summary["delivered"] / total, 4) if total else None,
            "duplicate_records": facts["records"] - facts["distinct"], "ledger_records": facts["records"],
            "states": facts["states"], "attempt_results": facts["attempt_results"],
            "unknown_attempts": facts["attempt_results"].get("unknown", 0),
            "setup_margin_s": round((base - loaded) / S, 3), "durable": True, **machine()}
    if base < loaded:
        line["invalid"] = "setup overran the first instant"
    return line


def scenario(tmp: Path, quick: bool, sizes: list[int] | None = None,
             topologies: tuple[str, ...] | None = None, duration_s: int | None = None) -> Iterator[dict[str, Any]]:
    """Every (store, receiver, N) run of the scenario (see the module docstring), one line each, as
    each run ends. One PostgreSQL server serves every PostgreSQL run (a fresh database each).
    ``duration_s``: seconds of fires instead of the form's (60; quick 10)."""
    ns = sizes or ([300] if quick else [100, 300, 1000, 3000])
    topos = topologies or (("sqlite-serve", "postgres-serve") if quick else TOPOLOGIES)
    duration_s = duration_s or (10 if quick else 60)
    drain_s = 5.0 if quick else 10.0
    with ExitStack() as stack:
        stores = Stores(tmp)
        stack.callback(stores.close)
        for topology in topos:
            for n in ns:
                for receiver in RECEIVERS:
                    url, _ = stores.fresh(topology, f"overload-{receiver}-{n}")
                    try:
                        line = one(topology, receiver, url, tmp, n, duration_s, drain_s)
                    except Exception as exc:   # one failed run must not lose the others
                        line = failed_line(SCENARIO, topology, n * duration_s, exc, receiver=receiver, triggers=n)
                    say(f"{SCENARIO} {topology} {receiver} N={n}: delivered {line.get('delivered')} of "
                        f"{line.get('n')}, p99 {line.get('lateness_p99_s')} s")
                    yield line
