"""Commit scenario: the timing plane alone against the raw batched store rate, same engine, same schema.

* **Timing plane**: ``n`` interval triggers (``every 1h``) whose due rows are due now; the real
  ``TimingLoop.tick()`` (system clock, its default batch, no dispatch) claims them, plans each with
  the product's policies, and commits the fires and due-row advances (``Store.apply_decisions``).
  ``fires_per_s`` = n ÷ the wall time of the ticks.
* **Raw**: the same due rows in a fresh database; a plain loop inserts one fire row (the ledger's
  NOT NULL columns) and compare-and-sets the due row forward, 100 per transaction, on the store's
  own connection (same pragmas): once statement by statement (``raw_execute``) and once with
  ``executemany`` per batch (``raw_executemany``). The ratio uses the faster of the two.
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

from benchkit import SECRET, S, machine, rnd, say
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


def scenario(tmp: Path, n: int) -> list[dict[str, Any]]:
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
                return f"sqlite:///{tmp}/commit-{tag}.db" if engine == "sqlite" else server.new_database("bench")

            say(f"{system} {name}: timing plane, then the raw loop ({n} due rows each)")
            tp = timing_plane(url("timing"), n)
            r1 = raw(url("raw1"), n, many=False)
            r2 = raw(url("rawmany"), n, many=True)
            r3 = raw(url("rawmin"), n, many=True, minimal=True)
            best = max(r1["per_s"], r2["per_s"])
            lines.append({
                "scenario": name, "system": system, "durable": True, "n": n,
                "fires_per_s": rnd(tp["per_s"], 1), **KEYS_NA,
                "timing_plane_fires": tp["fires"], "timing_plane_wall_s": rnd(tp["wall_s"], 3),
                "timing_batch": tp["batch"],
                "raw_execute_per_s": rnd(r1["per_s"], 1), "raw_executemany_per_s": rnd(r2["per_s"], 1),
                "raw_minimal_schema_per_s": rnd(r3["per_s"], 1), "raw_batch": RAW_BATCH,
                "ratio_to_raw": rnd(tp["per_s"] / best, 3),
                "target_ratio": 0.5, "target_met": tp["per_s"] / best >= 0.5,
                "durability": "WAL, synchronous=NORMAL" if engine == "sqlite"
                else ("fsync, synchronous_commit, full_page_writes on" if not os.environ.get("FIRELEDGER_TEST_PG_URL")
                      else "as the external server is configured"),
                **machine()})
    return lines
