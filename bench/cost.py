"""``cost``: what one signed, recorded delivery costs — CPU per plane and store work — on both stores
(issue 15, goal 4).

A steady load of ``RATE`` fires/s (``RATE`` interval triggers of 1 s, anchored evenly over the second,
one tenant with its quota out of the way, one verified HTTP target: the bench sink) for ``D`` seconds,
on four topologies:

* ``sqlite-serve`` / ``postgres-serve`` — ``fireledger serve`` (every plane in one process): the total;
* ``sqlite-split`` / ``postgres-split`` — ``fireledger control`` + ``timing`` + ``dispatch``, one process
  each: the cost of each plane (``control`` is idle: nothing calls the API during the window).

Every process runs under ``bench/costhook.py``, which counts the statements it executes (SQLite: a
trace callback, one count per statement stepped; PostgreSQL: psycopg's ``execute``/``executemany``,
one per parameter set) and SQLite's rows written (``total_changes``). Over a window that leaves out
the first seconds (warm-up), the bench reads each process's CPU time (user + system, ``/proc``, its
children included) and those counters, and divides by the plane's own work in the window: the timing
plane's by the fires committed in it (``decided_us``), the others' by the fires the sink received in
it (first arrivals): ``cpu_us_per_fire_by_plane`` and their sum ``cpu_us_per_fire`` (statements
likewise); ``keeping_up`` is false when fewer fires were delivered than committed in the window —
then a ``serve`` line (one process) charges the commits of undelivered fires to the delivered ones;
``statements_per_fire`` (by verb), ``rows_written_per_fire``. WAL per fire: SQLite — frames appended
to the ``-wal`` file (the WAL index header's ``mxFrame`` in the ``-shm`` file, sampled every few
milliseconds by the bench, a reset after a checkpoint counted) × (page size + 24); PostgreSQL —
``pg_current_wal_lsn()`` moved, with transactions and rows written from ``pg_stat_database``, from
the end of the load to the stop of the processes, divided by the fires recorded for the run.

The throwaway PostgreSQL server runs with ``fsync``, ``synchronous_commit`` and ``full_page_writes``
back on (``Stores(durable=True)``; each PostgreSQL line's ``pg_settings`` says what the server ran).
On PostgreSQL the server's CPU (postmaster and backends, ``/proc``) over the window is charged per
fire delivered in it: ``cpu_us_per_fire_postgres``. Each line also prices a million fires
(``per_million_fires``): CPU-seconds (planes + server), WAL bytes, the price at
:data:`PRICE_VCPU_HOUR` per vCPU-hour and :data:`PRICE_PER_GB` per GB of WAL and its ratio to the
seed's $0.60, and the cores and 2-vCPU nodes for the seed's 5,800/s mean and 45,000/s peak
(docs/performance.md, "Cost per million fires").
Full: 1,000 fires/s for 10 s (window: the last 8 s); ``--quick``: 5 s (the last 4 s).
"""

from __future__ import annotations

import math
import os
import signal
import struct
import sys
import threading
import time
from collections import Counter
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
    load_stream,
    machine,
    roles_for,
    say,
    summarise,
    wait_until,
)
from fireledger.store import Store
from load import tenant_and_target

SCENARIO = "cost"
TOPOLOGIES = ("sqlite-serve", "sqlite-split", "postgres-serve", "postgres-split")
RATE = 1000
#: Stated prices (docs/performance.md, "Cost per million fires"; assumptions, not quotes): an on-demand
#: vCPU-hour of a general-purpose cloud VM, and a GB of WAL shipped off the machine (replication /
#: backup transfer and storage writes).
PRICE_VCPU_HOUR = 0.04
PRICE_PER_GB = 0.09
PRICE_BASIS = ("assumed 2026 public-cloud on-demand list prices: $0.04 per vCPU-hour (AWS EC2 us-east-1 "
               "c7g.large $0.0725/h and m7i.large $0.1008/h for 2 vCPU: $0.036-0.050), $0.09 per GB "
               "(AWS data transfer out, first tier; WAL shipped off the machine)")
SEED_TARGET_PER_MILLION = 0.60
#: Nodes for the seed's loads: 2-vCPU machines (this one) run at most this fraction busy.
NODE_VCPUS = 2
NODE_BUSY = 0.7
SEED_MEAN_PER_S = 5800
SEED_PEAK_PER_S = 45000


def cpu_tree_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants, plus the children it reaped."""
    tck = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(d)] = fields
        kids.setdefault(int(fields[1]), []).append(int(d))
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        f = stats.get(p)
        if f is None:
            continue
        total += (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / tck   # utime stime cutime cstime
        todo.extend(kids.get(p, []))
    return total


class WalFrames:
    """Counts frames appended to a SQLite ``-wal`` file by sampling the WAL index (``-shm``) header's
    ``mxFrame`` every ``interval_s``; a drop (the log restarted after a checkpoint) adds what was
    there. Frames written between the last sample and a restart are missed (small: a restart
    follows a checkpoint of ~1,000 pages). Each new frame's header (``-wal``) is read too: the page
    it holds (``pages``: frames per page number, mapped to the b-tree that owns the page by
    :func:`wal_by_btree`) and whether it ends a transaction (``commits``)."""

    def __init__(self, db: Path, interval_s: float = 0.003) -> None:
        self.shm = Path(str(db) + "-shm")
        self.wal = Path(str(db) + "-wal")
        self.interval_s = interval_s
        self.done = 0
        self.last = 0
        self.page = 4096
        self.restarts = 0
        self.pages: Counter[int] = Counter()
        self.commits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="wal-frames")
        self._thread.start()

    def _read(self) -> tuple[int, int] | None:
        try:
            with open(self.shm, "rb") as fh:
                head = fh.read(96)
        except OSError:
            return None
        if len(head) < 96 or head[:48] != head[48:96]:
            return None   # not there yet, or a header being rewritten: sample again
        size = struct.unpack_from("=H", head, 14)[0]
        return struct.unpack_from("=I", head, 16)[0], (65536 if size == 1 else size)

    def _headers(self, first: int, upto: int) -> None:
        """Frames ``first + 1`` … ``upto`` (1-based) of the current log: page number and commit mark."""
        size = self.page + 24
        try:
            with open(self.wal, "rb") as fh:
                for i in range(first, upto):
                    fh.seek(32 + i * size)
                    head = fh.read(8)
                    if len(head) < 8:
                        return
                    pgno, db_pages = struct.unpack(">II", head)
                    self.pages[pgno] += 1
                    self.commits += db_pages != 0
        except OSError:
            return

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            got = self._read()
            if got is None:
                continue
            mx, self.page = got
            if mx < self.last:
                self.done += self.last
                self.restarts += 1
                self.last = 0
            if mx > self.last:
                self._headers(self.last, mx)
            self.last = mx

    def frames(self) -> int:
        return self.done + self.last

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def wal_by_btree(db: Path, pages: Counter[int], fires: int) -> dict[str, float]:
    """Frames per fire by the b-tree (table or index) that owns each page now (``dbstat``; a page
    freed and reused meanwhile is charged to its current owner, a page beyond the file to
    ``(freelist/new)``), largest first."""
    from fireledger.store.sqlitelib import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        owner = {int(p): str(n) for n, p in conn.execute("SELECT name, pageno FROM dbstat")}
    except sqlite3.Error:
        return {}
    finally:
        conn.close()
    by: Counter[str] = Counter()
    for pgno, k in pages.items():
        by[owner.get(pgno, "(freelist/new)")] += k
    return {n: round(k / fires, 3) for n, k in by.most_common() if fires}


def _counters(pids: list[int], out_dir: Path) -> dict[int, dict[str, Any]]:
    """Ask each process for its statement counters (SIGUSR1, bench/costhook.py) and read them."""
    before = {}
    for pid in pids:
        p = out_dir / f"{pid}.json"
        before[pid] = _read_json(p).get("seq", 0) if p.exists() else 0
        os.kill(pid, signal.SIGUSR1)
    got: dict[int, dict[str, Any]] = {}

    def ready() -> bool:
        for pid in pids:
            doc = _read_json(out_dir / f"{pid}.json")
            if doc.get("seq", 0) > before[pid]:
                got[pid] = doc
        return len(got) == len(pids)

    wait_until(ready, 10, interval_s=0.01, what="statement counters")
    return got


def _read_json(path: Path) -> dict[str, Any]:
    import json

    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {}


def _pg_stats(url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, xact_commit, xact_rollback, tup_inserted, "
            "tup_updated, tup_deleted FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    keys = ("wal_lsn", "xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted")
    return {k: int(v) for k, v in zip(keys, row, strict=True)}


class Planes:
    """A fresh store with the bench tenant and target, and the processes of one topology, each under
    ``bench/costhook.py``."""

    def __init__(self, topology: str, url: str, tmp: Path, sink: Sink) -> None:
        from e2e import BIN

        self.url = url
        now = time.time_ns() // 1000
        store = Store.open(url)
        try:
            self.tenant, self.target = tenant_and_target(store, sink.url, SECRET, now)
        finally:
            store.close()
        self.out = tmp / f"cost-{time.monotonic_ns()}"
        self.out.mkdir()
        self.roles = roles_for(topology, ["control", "timing", "dispatch"])
        self.pg_pid: int | None = None
        assert BIN.exists()
        self.planes = benchkit.Planes(url, tmp, self.roles, env={"FIRELEDGER_BENCH_COST_DIR": str(self.out)},
                                      prefix=[sys.executable, str(BENCH / "costhook.py")])
        # A plane without an HTTP listener has no health check: wait until its hook is installed.
        try:
            wait_until(lambda: all((self.out / f"{pid}.json").exists() for pid in self.pids), 60,
                       what="the planes' counters")
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return self.planes.pids

    def load(self, rate: int, base_us: int, end_us: int) -> dict[str, Any]:
        return load_stream(self.url, self.tenant, self.target, rate, base_us, end_us, spread=True)

    def sample(self) -> dict[str, Any]:
        """CPU seconds and statement counters per role, now; with ``pg_pid`` set, the PostgreSQL
        server's CPU seconds (postmaster and backends) under ``_postgres``."""
        counters = _counters(self.pids, self.out)
        out: dict[str, Any] = {role: {"cpu_s": cpu_tree_s(pid), **counters[pid]}
                               for role, pid in zip(self.roles, self.pids, strict=True)}
        if self.pg_pid is not None:
            out["_postgres"] = {"cpu_s": cpu_tree_s(self.pg_pid)}
        return out

    def stop(self) -> None:
        self.planes.stop()


def _delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    stmts = {k: v - a["statements"].get(k, 0) for k, v in b["statements"].items()}
    return {"cpu_s": b["cpu_s"] - a["cpu_s"], "statements": {k: v for k, v in stmts.items() if v},
            "statements_total": b["statements_total"] - a["statements_total"],
            "sqlite_rows_written": b["sqlite_rows_written"] - a["sqlite_rows_written"]}


def _committed(url: str, window: tuple[int, int], column: str = "decided_us") -> int:
    """Fires whose record was committed (``decided_us``) in ``window`` (or whose ``column`` is in it)."""
    store = Store.open(url)
    ph = "?" if store.engine_name == "sqlite" else "%s"
    try:
        with store.engine.read() as c:
            row = c.execute(f"SELECT COUNT(*) FROM fires WHERE {column} >= {ph} AND {column} < {ph}",
                            window).fetchone()
    finally:
        store.close()
    return int(row[0])


def _per(x: float, n: int, nd: int = 1) -> float | None:
    return round(x / n, nd) if n else None


def _price(cpu_us: float | None, wal_bytes: float | None, store_cpu_us: float | None = None) -> dict[str, Any]:
    """A million fires: CPU-seconds (the planes', plus the PostgreSQL server's when measured), WAL
    bytes, their price at the stated rates and its ratio to the seed's target, and the cores and
    2-vCPU nodes (at most :data:`NODE_BUSY` busy) the seed's mean and peak rates would need."""
    if cpu_us is None:
        return {}
    total_us = cpu_us + (store_cpu_us or 0.0)
    cpu_s_per_m = total_us   # µs per fire × 10^6 fires = seconds
    wal_per_m = (wal_bytes or 0) * 1e6
    usd_cpu = cpu_s_per_m / 3600 * PRICE_VCPU_HOUR
    usd_wal = wal_per_m / 1e9 * PRICE_PER_GB
    usd = usd_cpu + usd_wal
    cores = {rate: total_us * rate / 1e6 for rate in (SEED_MEAN_PER_S, SEED_PEAK_PER_S)}
    return {"cpu_s": round(cpu_s_per_m, 1), "planes_cpu_s": round(cpu_us, 1),
            "store_cpu_s": round(store_cpu_us, 1) if store_cpu_us is not None else None,
            "wal_bytes": round(wal_per_m), "wal_gb": round(wal_per_m / 1e9, 3),
            "usd_cpu": round(usd_cpu, 4), "usd_wal": round(usd_wal, 4), "usd": round(usd, 4),
            "vs_seed_target": round(usd / SEED_TARGET_PER_MILLION, 3),
            "usd_per_vcpu_hour": PRICE_VCPU_HOUR, "usd_per_gb": PRICE_PER_GB, "price_basis": PRICE_BASIS,
            "seed_target_usd": SEED_TARGET_PER_MILLION,
            "cores_for_5800_per_s": round(cores[SEED_MEAN_PER_S], 2),
            "cores_for_45000_per_s": round(cores[SEED_PEAK_PER_S], 2),
            "nodes_2vcpu_for_5800_per_s": math.ceil(cores[SEED_MEAN_PER_S] / (NODE_VCPUS * NODE_BUSY)),
            "nodes_2vcpu_for_45000_per_s": math.ceil(cores[SEED_PEAK_PER_S] / (NODE_VCPUS * NODE_BUSY)),
            "node_assumption": f"{NODE_VCPUS} vCPU, at most {NODE_BUSY:.0%} busy; CPU scales with fires/s "
                               "(no fixed per-process cost counted)"}


def _window_facts(planes: Planes, topology: str, db: Path | None, base: int, end: int,
                  warm_s: int) -> tuple[dict[str, Any], dict[str, Any], int, int, WalFrames | None]:
    """Sample at the window's start and end (both whole seconds after ``base``)."""
    w0 = base + warm_s * S
    wal = WalFrames(db) if db is not None else None
    wait_until(lambda: time.time_ns() // 1000 >= w0, (w0 - time.time_ns() // 1000) / S + 30, interval_s=0.005,
               what="the window")
    frames0 = wal.frames() if wal else 0
    a = planes.sample()
    wait_until(lambda: time.time_ns() // 1000 >= end, (end - time.time_ns() // 1000) / S + 30, interval_s=0.005,
               what="the window's end")
    b = planes.sample()
    frames = (wal.frames() - frames0) if wal else 0
    return a, b, frames, (wal.page if wal else 0), wal


def one(topology: str, url: str, db: Path | None, tmp: Path, sink: Sink, rate: int, duration_s: int,
        warm_s: int, pg_pid: int | None = None) -> dict[str, Any]:
    """One run of one topology (see the module docstring); ``pg_pid``: the PostgreSQL server's
    postmaster, whose CPU (with its backends') is charged per fire delivered in the window."""
    sink.clear()
    with ExitStack() as stack:
        planes = Planes(topology, url, tmp, sink)
        stack.callback(planes.stop)
        planes.pg_pid = pg_pid
        base = (time.time_ns() // S // 1000 + math.ceil(2 + rate * 0.0003)) * S   # the load: ~0.2 s
        end = base + duration_s * S
        info = planes.load(rate, base, end)
        pg0 = _pg_stats(url) if db is None else None
        say(f"{SCENARIO} {topology}: {info['triggers']} triggers loaded in {info['load_s']:.1f}s; "
            f"{duration_s}s of {rate} fires/s, window the last {duration_s - warm_s}s")
        a, b, frames, page, wal = _window_facts(planes, topology, db, base, end, warm_s)
        if wal is not None:
            stack.callback(wal.close)
        n = rate * duration_s
        wait_until(lambda: sink.count() >= n or time.time_ns() // 1000 > end + 5 * S, 40, interval_s=0.1,
                   what="deliveries")
        planes.stop()
        pg1 = _pg_stats(url) if db is None else None
        records = sink.records()
    w0_ns, w1_ns = (base + warm_s * S) * 1000, end * 1000
    in_window = len({ident for ns, ident in records if w0_ns <= ns < w1_ns})
    committed = _committed(url, (base + warm_s * S, end))
    summary = summarise(records, n, t0_us=base, window=(base, end))
    planes_d = {role: _delta(a[role], b[role]) for role in planes.roles}
    # Each plane's CPU per unit of its own work: the timing plane's per fire committed in the window,
    # the others' per fire delivered in it (equal when the planes keep up; apart when they do not).
    work = {r: committed if r == "timing" else in_window for r in planes_d}
    by_plane = {r: round(p["cpu_s"] * 1e6 / work[r], 1) if work[r] else 0.0 for r, p in planes_d.items()}
    stmts = sum(_per(p["statements_total"], work[r], 4) or 0.0 for r, p in planes_d.items())
    line: dict[str, Any] = {
        "scenario": SCENARIO, "system": f"fireledger-{topology}", "topology": topology, "rate": rate,
        "duration_s": duration_s, "window_s": duration_s - warm_s, "delivered_in_window": in_window, **summary,
        "committed_in_window": committed,
        "cpu_us_per_fire": round(sum(by_plane.values()), 1) if in_window and committed else None,
        "cpu_us_per_fire_by_plane": by_plane,
        "statements_per_fire": round(stmts, 2),
        "statements_per_fire_by_plane": {r: {k: _per(v, work[r], 2) for k, v in sorted(p["statements"].items())}
                                         for r, p in planes_d.items()},
        # Delivery kept up with the commits: only then is a one-process (serve) figure per fire.
        "keeping_up": bool(committed) and in_window >= 0.95 * committed,
        "durable": True, **machine()}
    if db is not None:
        wal_bytes = frames * (page + 24)
        line["rows_written_per_fire"] = _per(sum(p["sqlite_rows_written"] for p in planes_d.values()), in_window, 2)
        line["wal_bytes_per_fire"] = _per(wal_bytes, in_window, 0)
        line["wal_frames_per_fire"] = _per(frames, in_window, 2)
        if wal is not None and in_window:
            # Frames per fire by owning b-tree, and commits, over the whole run (load to stop).
            line["wal_frames_by_btree_per_fire"] = wal_by_btree(db, wal.pages, n)
            line["wal_commits_per_fire"] = _per(wal.commits, n, 3)
    else:
        assert pg0 is not None and pg1 is not None
        recorded = _committed(url, (base, end), "scheduled_us")   # every fire of the run, delivered or not
        d = {k: pg1[k] - pg0[k] for k in pg0}
        line["rows_written_per_fire"] = _per(d["tup_inserted"] + d["tup_updated"] + d["tup_deleted"], recorded, 2)
        line["wal_bytes_per_fire"] = _per(d["wal_lsn"], recorded, 0)
        line["transactions_per_fire"] = _per(d["xact_commit"] + d["xact_rollback"], recorded, 3)
        line["pg_span"] = ("rows, WAL and transactions: from the end of the load to the stop, per fire recorded "
                           "(with keeping_up false, the undelivered fires' dispatch work is missing)")
    pg_us = None
    if "_postgres" in a and "_postgres" in b and in_window:
        pg_us = round((b["_postgres"]["cpu_s"] - a["_postgres"]["cpu_s"]) * 1e6 / in_window, 1)
        line["cpu_us_per_fire_postgres"] = pg_us
    line["per_million_fires"] = _price(line["cpu_us_per_fire"], line["wal_bytes_per_fire"], pg_us)
    return line


def scenario(tmp: Path, quick: bool, topologies: tuple[str, ...] | None = None,
             sink: Sink | None = None, rate: int = RATE) -> Iterator[dict[str, Any]]:
    """Every topology's line (module docstring), as each run ends; one PostgreSQL server for both
    PostgreSQL topologies (a fresh database each). ``rate``: fires/s (a lower one keeps up on a busy
    machine, where per-cycle costs show; at 1,000/s a loaded machine batches everything)."""
    duration_s, warm_s = (5, 1) if quick else (10, 2)
    with ExitStack() as stack:
        if sink is None:
            sink = Sink(tmp)
            stack.callback(sink.close)
        stores = Stores(tmp, durable=True)   # a price is for a durable server: fsync, full-page writes on
        stack.callback(stores.close)
        for topology in topologies or TOPOLOGIES:
            url, db = stores.fresh(topology, "cost")
            try:
                proc = getattr(stores._pg, "_proc", None)   # our throwaway server (None: SQLite, or external)
                line = one(topology, url, db, tmp, sink, rate, duration_s, warm_s,
                           pg_pid=proc.pid if db is None and proc is not None else None)
            except Exception as exc:   # one failed run must not lose the others
                line = failed_line(SCENARIO, topology, rate * duration_s, exc)
            if db is None:
                line["pg_settings"] = stores.pg_settings()
            say(f"{SCENARIO} {topology}: {line.get('cpu_us_per_fire')} CPU-µs/fire "
                f"{line.get('cpu_us_per_fire_by_plane')}, {line.get('statements_per_fire')} statements/fire, "
                f"WAL {line.get('wal_bytes_per_fire')} B/fire")
            yield line
