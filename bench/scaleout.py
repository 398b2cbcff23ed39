"""``scale-out``: does a second and a third dispatch process add delivery capacity on one PostgreSQL
store, and what does each fire cost the planes and the primary (issue 15, goal 6; decision 0198)?

**Split planes on PostgreSQL, a backlog drained** (``postgres-split``): ``fireledger control`` +
``timing`` + N ``dispatch`` processes (N = 1, 2, 3), each under ``bench/costhook.py`` (statement
counts), one tenant with its quota out of the way, one verified target (the bench sink). Per N, on a
fresh database:

1. start the planes and wait until every dispatch process is idle (its CPU time flat);
2. freeze the dispatchers (``SIGSTOP``), load ``M`` triggers due at one instant, and let the timing
   plane commit all ``M`` fires (the commit phase: timing CPU, WAL per fire committed);
3. release the dispatchers (``SIGCONT``) and wait until the sink has all ``M`` (the drain phase).

Why a drain and not a fixed offered load: on a 2-core machine a steady load keeps the timing plane,
the bench's clock and the load's own commits on the same cores as the dispatchers during the whole
window, so "delivered/s" would mix the planes' capacities; a frozen backlog leaves only the
dispatchers, PostgreSQL and the sink working in the drain, and the backlog is always above what N
dispatchers can take (every claim finds a full batch) — the rate measured is their capacity.

Per N the line has ``delivered_per_s`` (M ÷ (last arrival − release)), ``steady_per_s`` (the
arrivals between the 10th and 90th percentile ÷ their time: the ramp and the tail left out),
``lateness_p50_s``/``_p99_s`` (arrival − release: how long a fire of the backlog waited; the
scheduled instant lies before the freeze ended, so lateness from it would measure the freeze),
``cpu_us_per_fire_by_plane`` (dispatch: all N processes ÷ M over the drain; timing: per fire
committed in the commit phase; control: idle, ÷ M over the run; ``postgres``: the server's
processes in the drain), ``cores_busy_in_drain`` (CPU seconds ÷ drain time: under one per
dispatch process means it waited — for the store, the sink or, on a shared machine, for a core),
``statements_per_fire_by_plane``, and the primary's work per fire in each phase from
``pg_stat_database`` (transactions, rows written) and ``pg_current_wal_lsn()`` (WAL bytes) —
``pg_stat_statements`` is not loaded on the throwaway server. ``vs_n1`` is each figure ÷ the N = 1
figure of the same run. Every line also checks what must hold whatever N: ``early`` (arrivals
before their instant), ``duplicate_deliveries`` (a fire sent twice: the sink answers 200 to all, so
that would be a second claim) and ``duplicate_records`` (ledger rows beyond one per trigger and
instant), all 0.

**``serve`` with ``FIRELEDGER_DISPATCH_PROCESSES`` = 1 and 2** (``sqlite-serve``, ``postgres-serve``):
``M`` one-shot fires due at one instant (the ``burst`` shape: the timing plane is in the dispatching
process, so it cannot be frozen apart); ``delivered_per_s`` from the instant, lateness from it, CPU
of the whole process tree per fire, ``vs_p1``.

The throwaway PostgreSQL server runs durable (``fsync``, ``synchronous_commit``, ``full_page_writes``
on; ``pg_settings`` on each PostgreSQL line). Full: M = 10,000; ``--quick``: M = 3,000 (and, from
``bench/run.py --quick``, N = 1, 2 without the serve forms).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import benchkit
from benchkit import (
    BENCH,
    SECRET,
    S,
    Sink,
    Stores,
    failed_line,
    identify,
    load_stream,
    machine,
    pct,
    say,
    wait_until,
)
from cost import _counters, _delta, _pg_stats, cpu_tree_s
from fireledger.store import Store
from load import tenant_and_target

SCENARIO = "scale-out"
DISPATCHERS = (1, 2, 3)
SERVE_TOPOLOGIES = ("sqlite-serve", "postgres-serve")


def _count(url: str, at_us: int) -> int:
    """Fires recorded at the instant ``at_us``."""
    store = Store.open(url)
    ph = "?" if store.engine_name == "sqlite" else "%s"
    try:
        with store.engine.read() as c:
            row = c.execute(f"SELECT COUNT(*) FROM fires WHERE scheduled_us = {ph}", (at_us,)).fetchone()
    finally:
        store.close()
    return int(row[0])


def _integrity(sink: Sink, url: str, at_us: int) -> dict[str, int]:
    """What must hold however many processes dispatch: no arrival before its instant (``early``), no
    fire sent twice (``duplicate_deliveries``: the sink answers 200 to every request, so a second
    arrival would mean a second claim), one ledger record per (trigger, instant) at ``at_us``."""
    records = sink.records()
    early = sum(1 for ns, ident in records if (got := identify(ident)) is not None and ns // 1000 < got[1])
    idents = [ident for _, ident in records]
    store = Store.open(url)
    ph = "?" if store.engine_name == "sqlite" else "%s"
    try:
        with store.engine.read() as c:
            total, distinct = c.execute(f"SELECT COUNT(*), COUNT(DISTINCT trigger_id) FROM fires "
                                        f"WHERE scheduled_us = {ph}", (at_us,)).fetchone()
    finally:
        store.close()
    return {"early": early, "duplicate_deliveries": len(idents) - len(set(idents)),
            "duplicate_records": int(total) - int(distinct)}


def _idle(pids: list[int], timeout_s: float = 90) -> None:
    """Wait until every process has used under 2 % of a core over the last second (started, idle)."""
    last = {p: cpu_tree_s(p) for p in pids}
    stamp = [time.monotonic()]

    def flat() -> bool:
        if time.monotonic() - stamp[0] < 1.0:
            return False
        now = {p: cpu_tree_s(p) for p in pids}
        quiet = all(now[p] - last[p] < 0.02 for p in pids)
        last.update(now)
        stamp[0] = time.monotonic()
        return quiet

    wait_until(flat, timeout_s, interval_s=0.1, what="the planes to be idle")


def _pg_cpu(stores: Stores) -> float | None:
    """CPU seconds of the throwaway PostgreSQL server (postmaster and its backends), if it is ours."""
    proc = getattr(stores._pg, "_proc", None)
    return cpu_tree_s(proc.pid) if proc is not None else None


def _arrivals(sink: Sink, since_ns: int) -> list[int]:
    """First arrival (ns) of each fire the sink received."""
    first: dict[str, int] = {}
    for ns, ident in sink.records():
        if ident not in first or ns < first[ident]:
            first[ident] = ns
    return sorted(ns for ns in first.values() if ns >= since_ns)


def _rates(arr: list[int], t0_ns: int) -> dict[str, Any]:
    """Drain rate, the 10–90 % rate and waiting time (arrival − ``t0_ns``) of sorted arrivals."""
    if not arr:
        return {"delivered": 0, "delivered_per_s": 0.0, "steady_per_s": None}
    lo, hi = int(0.1 * len(arr)), max(int(0.9 * len(arr)) - 1, 0)
    span = (arr[hi] - arr[lo]) / 1e9
    wait = [(a - t0_ns) / 1e9 for a in arr]
    return {"delivered": len(arr), "drain_s": round((arr[-1] - t0_ns) / 1e9, 3),
            "delivered_per_s": round(len(arr) / max(1e-6, (arr[-1] - t0_ns) / 1e9), 1),
            "steady_per_s": round((hi - lo) / span, 1) if span > 0 else None,
            "lateness_p50_s": round(pct(wait, 50) or 0.0, 4), "lateness_p99_s": round(pct(wait, 99) or 0.0, 4),
            "lateness_max_s": round(wait[-1], 4)}


def _per(x: float, n: int, nd: int = 2) -> float | None:
    return round(x / n, nd) if n else None


class Split:
    """control + timing + ``n`` dispatch processes under ``bench/costhook.py`` on a fresh store."""

    def __init__(self, url: str, tmp: Path, sink: Sink, n: int) -> None:
        self.url = url
        now = time.time_ns() // 1000
        store = Store.open(url)
        try:
            self.tenant, self.target = tenant_and_target(store, sink.url, SECRET, now)
        finally:
            store.close()
        self.out = tmp / f"scaleout-{time.monotonic_ns()}"
        self.out.mkdir()
        self.roles = ["control", "timing", *(["dispatch"] * n)]
        self.planes = benchkit.Planes(url, tmp, self.roles, env={"FIRELEDGER_BENCH_COST_DIR": str(self.out)},
                                      prefix=[sys.executable, str(BENCH / "costhook.py")])
        self.frozen = False

    @property
    def dispatch_pids(self) -> list[int]:
        return [p for r, p in zip(self.roles, self.planes.pids, strict=True) if r == "dispatch"]

    def sample(self, roles: set[str]) -> dict[int, dict[str, Any]]:
        """CPU seconds and statement counters of the processes whose role is in ``roles``, by pid."""
        pids = [p for r, p in zip(self.roles, self.planes.pids, strict=True) if r in roles]
        counters = _counters(pids, self.out)
        return {p: {"cpu_s": cpu_tree_s(p), **counters[p]} for p in pids}

    def freeze(self, on: bool) -> None:
        for pid in self.dispatch_pids:
            os.kill(pid, signal.SIGSTOP if on else signal.SIGCONT)
        self.frozen = on

    def stop(self) -> None:
        if self.frozen:
            self.freeze(False)
        self.planes.stop()


def _sum(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], pids: list[int]) -> dict[str, Any]:
    """The deltas of ``pids`` between samples ``a`` and ``b``, added up."""
    out: dict[str, Any] = {"cpu_s": 0.0, "statements": {}, "statements_total": 0}
    for p in pids:
        d = _delta(a[p], b[p])
        out["cpu_s"] += d["cpu_s"]
        out["statements_total"] += d["statements_total"]
        for k, v in d["statements"].items():
            out["statements"][k] = out["statements"].get(k, 0) + v
    return out


def _pg_per_fire(a: dict[str, int], b: dict[str, int], m: int) -> dict[str, Any]:
    d = {k: b[k] - a[k] for k in a}
    return {"wal_bytes": _per(d["wal_lsn"], m, 0), "transactions": _per(d["xact_commit"] + d["xact_rollback"], m, 3),
            "rows_written": _per(d["tup_inserted"] + d["tup_updated"] + d["tup_deleted"], m)}


def _drain(split: Split, stores: Stores, sink: Sink, m: int, deadline_s: float) -> dict[str, Any]:
    """Steps 1–3 of the module docstring on running planes; the raw facts of one run."""
    pids = dict(zip(split.planes.pids, split.roles, strict=True))
    _idle(list(pids))
    s0 = split.sample({"control", "dispatch"})
    split.freeze(True)
    base = (time.time_ns() // S // 1000 + math.ceil(2 + m * 0.0003)) * S
    load_stream(split.url, split.tenant, split.target, m, base, base + S, spread=False)
    t_a = split.sample({"timing"})
    pg_a, cpu_a = _pg_stats(split.url), _pg_cpu(stores)
    wait_until(lambda: _count(split.url, base) >= m, 120, interval_s=0.05, what="the backlog committed")
    wait_until(lambda: _pg_stats(split.url)["tup_inserted"] - pg_a["tup_inserted"] >= m, 30, interval_s=0.1,
               what="the commit's statistics")
    t_b = split.sample({"timing"})
    pg_b, cpu_b = _pg_stats(split.url), _pg_cpu(stores)
    sink.clear()
    t_c = time.time_ns()
    split.freeze(False)
    wait_until(lambda: sink.count() >= m, deadline_s, interval_s=0.02, what="the backlog delivered")
    s2 = split.sample({"control", "dispatch"})
    cpu_c, wal_c = _pg_cpu(stores), _pg_stats(split.url)["wal_lsn"]
    split.stop()   # the backends' statistics are flushed as their connections close
    pg_c = {**_pg_stats(split.url), "wal_lsn": wal_c}
    return {"pids": pids, "s0": s0, "s2": s2, "t_a": t_a, "t_b": t_b, "pg": (pg_a, pg_b, pg_c),
            "pg_cpu": (cpu_a, cpu_b, cpu_c), "t_c": t_c, "arrivals": _arrivals(sink, t_c),
            "integrity": _integrity(sink, split.url, base)}


def split_line(url: str, tmp: Path, stores: Stores, sink: Sink, n: int, m: int) -> dict[str, Any]:
    """One N of the drain (module docstring)."""
    with ExitStack() as stack:
        split = Split(url, tmp, sink, n)
        stack.callback(split.stop)
        f = _drain(split, stores, sink, m, deadline_s=60 + m / 100)
    by_role = {r: [p for p, rr in f["pids"].items() if rr == r] for r in ("control", "timing", "dispatch")}
    disp = _sum(f["s0"], f["s2"], by_role["dispatch"])
    ctrl = _sum(f["s0"], f["s2"], by_role["control"])
    tim = _sum(f["t_a"], f["t_b"], by_role["timing"])
    pg_a, pg_b, pg_c = f["pg"]
    cpu_a, cpu_b, cpu_c = f["pg_cpu"]
    rates = _rates(f["arrivals"], f["t_c"])
    cpu = {"dispatch": _per(disp["cpu_s"] * 1e6, m, 1), "timing": _per(tim["cpu_s"] * 1e6, m, 1),
           "control_idle": _per(ctrl["cpu_s"] * 1e6, m, 1),
           "postgres_drain": _per((cpu_c - cpu_b) * 1e6, m, 1) if cpu_c is not None and cpu_b is not None else None,
           "postgres_commit": _per((cpu_b - cpu_a) * 1e6, m, 1) if cpu_b is not None and cpu_a is not None else None}
    drain_s = rates.get("drain_s") or 0.0
    busy = {"dispatch": round(disp["cpu_s"] / drain_s, 3) if drain_s else None,
            "postgres": round((cpu_c - cpu_b) / drain_s, 3) if drain_s and cpu_c is not None and cpu_b is not None
            else None}
    return {"scenario": SCENARIO, "system": "fireledger-postgres-split", "topology": "postgres-split",
            "form": "backlog-drain", "dispatch_processes": n, "n": m, **rates, "missed": m - rates["delivered"],
            "fires_per_s": rates["delivered_per_s"], **f["integrity"],
            "cpu_us_per_fire_by_plane": cpu,
            # cores kept busy in the drain: under 1 per dispatch process means it waited (for the store,
            # the sink, or — on a shared machine — for a core)
            "cores_busy_in_drain": busy,
            "statements_per_fire_by_plane": {
                "dispatch": {k: _per(v, m, 3) for k, v in sorted(disp["statements"].items())},
                "timing": {k: _per(v, m, 3) for k, v in sorted(tim["statements"].items())}},
            "statements_per_fire": {"dispatch": _per(disp["statements_total"], m, 3),
                                    "timing": _per(tim["statements_total"], m, 3)},
            "pg_per_fire": {"commit": _pg_per_fire(pg_a, pg_b, m), "drain": _pg_per_fire(pg_b, pg_c, m)},
            "pg_span": "commit: the timing plane committing the backlog (dispatchers frozen); drain: release to "
                       "all delivered (WAL) / to the planes' stop (transactions, rows)",
            "durable": True, **machine()}


def serve_line(url: str, db: Path | None, tmp: Path, sink: Sink, topology: str, p: int, m: int) -> dict[str, Any]:
    """``serve`` with ``FIRELEDGER_DISPATCH_PROCESSES`` = ``p``: ``m`` fires due at one instant."""
    sink.clear()
    now = time.time_ns() // 1000
    store = Store.open(url)
    try:
        tenant, target = tenant_and_target(store, sink.url, SECRET, now)
    finally:
        store.close()
    with ExitStack() as stack:
        planes = benchkit.Planes(url, tmp, ["serve"], env={"FIRELEDGER_DISPATCH_PROCESSES": str(p)})
        stack.callback(planes.stop)
        pid = planes.pids[0]
        _idle([pid])
        at = (time.time_ns() // S // 1000 + math.ceil(2 + m * 0.0003)) * S
        load_stream(url, tenant, target, m, at, at + S, spread=False)
        cpu0 = cpu_tree_s(pid)
        wait_until(lambda: sink.count() >= m, 60 + m / 100, interval_s=0.02, what="the burst delivered")
        cpu1 = cpu_tree_s(pid)
    rates = _rates(_arrivals(sink, at * 1000), at * 1000)
    return {"scenario": SCENARIO, "system": f"fireledger-{topology}", "topology": topology, "form": "burst",
            "dispatch_processes": p, "n": m, **rates, "missed": m - rates["delivered"],
            "fires_per_s": rates["delivered_per_s"], **_integrity(sink, url, at),
            "cpu_us_per_fire": _per((cpu1 - cpu0) * 1e6, m, 1),
            "cpu_note": "the serve process and its dispatch children, load to last delivery", "durable": True,
            **machine()}


def _vs(lines: list[dict[str, Any]], key: str) -> None:
    """``vs_<first>``: each line's rates, lateness and dispatch CPU ÷ those of the first line."""
    if not lines or lines[0].get("error"):
        return
    ref = lines[0]
    for line in lines:
        if line.get("error"):
            continue
        out = {}
        for k in ("delivered_per_s", "steady_per_s", "lateness_p99_s", "cpu_us_per_fire"):
            if line.get(k) and ref.get(k):
                out[k] = round(line[k] / ref[k], 3)
        d, r = (line.get("cpu_us_per_fire_by_plane") or {}), (ref.get("cpu_us_per_fire_by_plane") or {})
        if d.get("dispatch") and r.get("dispatch"):
            out["dispatch_cpu_us_per_fire"] = round(d["dispatch"] / r["dispatch"], 3)
        line[key] = out


def scenario(tmp: Path, quick: bool, sink: Sink | None = None, dispatchers: tuple[int, ...] = DISPATCHERS,
             serve: tuple[str, ...] = SERVE_TOPOLOGIES, m: int | None = None) -> Iterator[dict[str, Any]]:
    """The drain for each N in ``dispatchers``, then ``serve`` at 1 and 2 dispatch processes on each of
    ``serve``; lines of a group are yielded together, with their ratios to the first, each with its
    own ``scenario_wall_s``. ``m``: the backlog instead of the form's (10,000; quick 3,000)."""
    m = m or (3000 if quick else 10_000)
    with ExitStack() as stack:
        if sink is None:
            sink = Sink(tmp)
            stack.callback(sink.close)
        stores = Stores(tmp, durable=True)
        stack.callback(stores.close)
        lines = []
        for n in dispatchers:
            t0 = time.monotonic()
            url, _ = stores.fresh("postgres-split", f"scaleout-{n}")
            try:
                line = split_line(url, tmp, stores, sink, n, m)
            except Exception as exc:   # one failed run must not lose the others
                line = failed_line(SCENARIO, "postgres-split", m, exc, dispatch_processes=n)
            line["scenario_wall_s"] = round(time.monotonic() - t0, 1)
            line["pg_settings"] = stores.pg_settings()
            say(f"{SCENARIO} postgres-split N={n}: {line.get('delivered_per_s')}/s "
                f"(10-90 %: {line.get('steady_per_s')}/s), CPU {line.get('cpu_us_per_fire_by_plane')}")
            lines.append(line)
        _vs(lines, "vs_n1")
        yield from lines
        for topology in serve:
            group = []
            for p in (1, 2):
                t0 = time.monotonic()
                url, db = stores.fresh(topology, f"scaleout-serve-{p}")
                try:
                    line = serve_line(url, db, tmp, sink, topology, p, m)
                except Exception as exc:
                    line = failed_line(SCENARIO, topology, m, exc, dispatch_processes=p)
                line["scenario_wall_s"] = round(time.monotonic() - t0, 1)
                if db is None:
                    line["pg_settings"] = stores.pg_settings()
                say(f"{SCENARIO} {topology} P={p}: {line.get('delivered_per_s')}/s, "
                    f"p99 {line.get('lateness_p99_s')} s, {line.get('cpu_us_per_fire')} CPU-µs/fire")
                group.append(line)
            _vs(group, "vs_p1")
            yield from group


if __name__ == "__main__":
    import argparse
    import tempfile

    from benchkit import emit

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dispatchers", default="1,2,3", help="comma-separated N")
    ap.add_argument("--serve", default=",".join(SERVE_TOPOLOGIES), help="serve topologies ('' for none)")
    a = ap.parse_args()
    from e2e import use_state_dir

    use_state_dir(Path(tempfile.mkdtemp(prefix="fireledger-bench-state-")) / "state")
    with tempfile.TemporaryDirectory(prefix="fireledger-bench-") as d:
        for out in scenario(Path(d), a.quick, dispatchers=tuple(int(x) for x in a.dispatchers.split(",")),
                            serve=tuple(x for x in a.serve.split(",") if x)):
            emit(out)
