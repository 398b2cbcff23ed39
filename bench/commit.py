"""Commit scenario: the timing plane alone against the raw batched store rate, same engine, same schema.

* **Timing plane**: ``n`` interval triggers (``every 1h``) whose due rows are due now; the real
  ``TimingLoop.tick()`` (system clock, its default batch, no dispatch) claims them, plans each with
  the product's policies, and commits the fires and due-row advances (``Store.apply_decisions``).
  ``fires_per_s`` = n ÷ the wall time of the ticks.
* **Raw**: the same due rows in a fresh database; a plain loop inserts one fire row (the ledger's
  NOT NULL columns) and compare-and-sets the due row forward, 100 per transaction, on the store's
  own connection (same pragmas): once statement by statement (``raw_execute``) and once with
  ``executemany`` per batch (``raw_executemany``). The ratio uses the faster of the two.
* **Rounds**: the timing plane and the two raw loops run ``reps`` times (3), interleaved, each on a
  fresh database; the best of each side is compared (a machine shared with other work slows any one
  run by a factor of several — the best is the rate it gives when it is free, on both sides alike).
  Every round's rate is on the line, with the load average before and after. On SQLite, where all
  the work is in this process, the CPU time per fire of both sides is reported too
  (``cpu_ratio_to_raw``: the same comparison, insensitive to load).
* **Raw, minimal schema** (for reference, not the ratio): the same loop on a two-table schema — a
  ``fires`` table with only its primary key and a ``due`` table — on the same engine and
  connection settings: the engine's own limit, so the cost of the ledger's indexes shows apart.

On PostgreSQL the bench starts its own throwaway server (``tests/pgserver.py``) and switches its
durability back on (``fsync``, ``synchronous_commit``, ``full_page_writes``), or uses
``FIRELEDGER_TEST_PG_URL`` as it is; without server binaries the PostgreSQL lines say why they were
skipped. One connection, no partition leases (the single-node loop).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchkit import SECRET, S, machine, migrated_database, rnd, say
from fireledger.clock import SystemClock
from fireledger.store import Store
from fireledger.store.engine import SqliteEngine
from fireledger.timing import TimingLoop
from load import compiled, load_triggers, tenant_and_target

RAW_BATCH = 100
KEYS_NA = {"delivered": None, "missed": None, "early": None, "duplicate_records": None,
           "lateness_p50_s": None, "lateness_p99_s": None, "lateness_max_s": None}


def _prepare(url: str, n: int) -> tuple[Store, int]:
    store = Store.open(url, migrate=True)
    if isinstance(store.engine, SqliteEngine):
        # As `fireledger timing`/`serve` run it: WAL checkpoints on their own thread, off the commits
        # (the raw loop uses the same engine setup, so the ratio compares like with like).
        store.engine.start_checkpointer()
    now = time.time_ns() // 1000
    tenant, target = tenant_and_target(store, "http://127.0.0.1:9/unused", SECRET, now)
    due = now - S
    spec, _ = next(compiled([{"every": "1h", "anchor": _iso(due)}], now))
    load_triggers(store, tenant, target, ((spec, due) for _ in range(n)), now)
    return store, due


def _iso(us: int) -> str:
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant

    return format_instant(from_us(us))


def timing_plane(url: str, n: int) -> dict[str, Any]:
    store, _ = _prepare(url, n)
    try:
        loop = TimingLoop(store, SystemClock(), "bench-commit")
        inserted = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while True:
            res = loop.tick()
            inserted += len(res.inserted)
            if res.claimed_rows == 0:
                break
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"fires": inserted, "wall_s": wall, "per_s": inserted / wall, "cpu_per_s": inserted / cpu,
                "batch": loop.batch}
    finally:
        store.close()


MINIMAL = (
    "CREATE TABLE fires (tenant_id TEXT NOT NULL, trigger_id TEXT NOT NULL, scheduled_us BIGINT NOT NULL, "
    "seq INTEGER NOT NULL, version INTEGER NOT NULL, kind TEXT NOT NULL, lane TEXT NOT NULL, state TEXT NOT NULL, "
    "decided_us BIGINT NOT NULL, decided_by TEXT NOT NULL, tzdata_version TEXT NOT NULL, next_attempt_us BIGINT, "
    "PRIMARY KEY (tenant_id, trigger_id, scheduled_us, seq))",
    "CREATE TABLE due (trigger_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, next_us BIGINT NOT NULL, "
    "version INTEGER NOT NULL)",
)


class _Minimal:
    """Just an engine (same connection settings as the store's) with the two-table schema."""

    def __init__(self, url: str, n: int) -> None:
        from fireledger.domain.keys import new_id
        from fireledger.store.engine import engine_for_url

        self.engine = engine_for_url(url)
        self.engine_name = self.engine.name
        if isinstance(self.engine, SqliteEngine):
            self.engine.start_checkpointer()
        ph = "?" if self.engine_name == "sqlite" else "%s"
        due = time.time_ns() // 1000 - S
        tenant = new_id("tn")
        with self.engine.write() as c:
            cur = c.cursor()
            for ddl in MINIMAL:
                cur.execute(ddl)
            cur.executemany(f"INSERT INTO due VALUES ({ph}, {ph}, {ph}, {ph})",
                            [(new_id("tr"), tenant, due, 1) for _ in range(n)])

    def close(self) -> None:
        self.engine.close()


def raw(url: str, n: int, many: bool, minimal: bool = False) -> dict[str, Any]:
    store: Any = _Minimal(url, n) if minimal else _prepare(url, n)[0]
    ph = "?" if store.engine_name == "sqlite" else "%s"
    ins = ("INSERT INTO fires (tenant_id, trigger_id, scheduled_us, seq, version, kind, lane, state, decided_us, "
           f"decided_by, tzdata_version, next_attempt_us) VALUES ({', '.join([ph] * 12)})")
    upd = (f"UPDATE due SET next_us = {ph}, version = {ph} WHERE trigger_id = {ph} AND next_us = {ph} "
           f"AND version = {ph}")
    try:
        with store.engine.read() as c:
            rows = [tuple(r) for r in c.execute("SELECT trigger_id, tenant_id, next_us, version FROM due").fetchall()]
        now = time.time_ns() // 1000
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(0, len(rows), RAW_BATCH):
            chunk = rows[i:i + RAW_BATCH]
            fires = [(ten, tid, nxt, 0, ver, "scheduled", "on-time", "pending", now, "raw", "2026a", now)
                     for tid, ten, nxt, ver in chunk]
            moves = [(nxt + 3600 * S, ver, tid, nxt, ver) for tid, ten, nxt, ver in chunk]
            with store.engine.write() as c:
                cur = c.cursor()
                if many:
                    cur.executemany(ins, fires)
                    cur.executemany(upd, moves)
                else:
                    for f, m in zip(fires, moves, strict=True):
                        cur.execute(ins, f)
                        cur.execute(upd, m)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"fires": len(rows), "wall_s": wall, "per_s": len(rows) / wall, "cpu_per_s": len(rows) / cpu}
    finally:
        store.close()


@contextlib.contextmanager
def postgres() -> Iterator[tuple[Any | None, str | None]]:
    """(server, None) or (None, why not)."""
    try:
        from pgserver import PgServer
    except Exception as exc:   # psycopg missing or similar
        yield None, f"tests/pgserver.py unavailable: {exc}"
        return
    url = os.environ.get("FIRELEDGER_TEST_PG_URL")
    try:
        server = PgServer.external(url) if url else PgServer.start()
    except Exception as exc:
        yield None, f"could not start PostgreSQL ({str(exc).strip().splitlines()[0][:200]}); " \
                    "run ./scripts/ensure-postgres.sh"
        return
    try:
        if not url:
            import psycopg

            with psycopg.connect(server.url, autocommit=True) as c:   # the test server runs without fsync
                for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                    c.execute(f"ALTER SYSTEM SET {setting} = on")
                c.execute("SELECT pg_reload_conf()")
        yield server, None
    finally:
        server.close()


def _rounds(url: Any, n: int, reps: int) -> dict[str, list[dict[str, Any]]]:
    """``reps`` interleaved rounds of the timing plane and both raw loops (each on a fresh database),
    so a burst of load from elsewhere on the machine hits every side alike; the best of each side
    is what the ratio uses (the rate the machine gives when it is not taken by other work)."""
    runs: dict[str, list[dict[str, Any]]] = {"tp": [], "raw1": [], "rawmany": []}
    for i in range(reps):
        runs["tp"].append(timing_plane(url(f"timing{i}"), n))
        runs["raw1"].append(raw(url(f"raw1-{i}"), n, many=False))
        runs["rawmany"].append(raw(url(f"rawmany{i}"), n, many=True))
    return runs


def _best(runs: list[dict[str, Any]], key: str = "per_s") -> float:
    return max(float(r[key]) for r in runs)


def scenario(tmp: Path, n: int, reps: int = 3) -> list[dict[str, Any]]:
    lines = []
    with postgres() as (pg, why):
        engines: list[tuple[str, Any]] = [("sqlite", None), ("postgres", pg)]
        for engine, server in engines:
            name = f"commit-{n}"
            system = f"fireledger-{engine}"
            if engine == "postgres" and server is None:
                lines.append({"scenario": name, "system": system, "durable": True, "n": n, "fires_per_s": None,
                              **KEYS_NA, "skipped": why})
                continue

            def url(tag: str, engine: str = engine, server: Any = server) -> str:
                if engine == "sqlite":
                    return f"sqlite:///{tmp}/commit-{tag}.db"
                # the minimal schema goes into an empty database; the others get the ledger's, copied
                return server.new_database("bench") if tag == "rawmin" else migrated_database(server, "bench")

            say(f"{system} {name}: {reps} rounds of the timing plane, then the raw loops ({n} due rows each)")
            load_before = os.getloadavg()[0]
            runs = _rounds(url, n, reps)
            r3 = raw(url("rawmin"), n, many=True, minimal=True)
            tp, best = _best(runs["tp"]), max(_best(runs["raw1"]), _best(runs["rawmany"]))
            line = {
                "scenario": name, "system": system, "durable": True, "n": n,
                "fires_per_s": rnd(tp, 1), **KEYS_NA,
                "timing_plane_fires": runs["tp"][0]["fires"], "timing_batch": runs["tp"][0]["batch"],
                "rounds": reps, "timing_plane_per_s_each": [rnd(r["per_s"], 1) for r in runs["tp"]],
                "raw_execute_per_s": rnd(_best(runs["raw1"]), 1),
                "raw_executemany_per_s": rnd(_best(runs["rawmany"]), 1),
                "raw_best_per_s_each": [rnd(max(a["per_s"], b["per_s"]), 1)
                                        for a, b in zip(runs["raw1"], runs["rawmany"], strict=True)],
                "raw_minimal_schema_per_s": rnd(r3["per_s"], 1), "raw_batch": RAW_BATCH,
                "ratio_to_raw": rnd(tp / best, 3),
                "target_ratio": 0.5, "target_met": tp / best >= 0.5,
                "durability": "WAL, synchronous=NORMAL" if engine == "sqlite"
                else ("fsync, synchronous_commit, full_page_writes on" if not os.environ.get("FIRELEDGER_TEST_PG_URL")
                      else "as the external server is configured"),
                "load1_before": round(load_before, 2), **machine()}
            if engine == "sqlite":   # every cycle of work is in this process: CPU rates, immune to load
                cpu_tp = _best(runs["tp"], "cpu_per_s")
                cpu_raw = max(_best(runs["raw1"], "cpu_per_s"), _best(runs["rawmany"], "cpu_per_s"))
                line |= {"timing_plane_cpu_us_per_fire": rnd(1e6 / cpu_tp, 1),
                         "raw_cpu_us_per_row": rnd(1e6 / cpu_raw, 1), "cpu_ratio_to_raw": rnd(cpu_tp / cpu_raw, 3)}
            lines.append(line)
    return lines
