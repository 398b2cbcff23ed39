"""The fire and attempt rows are keyed by tenant and instant (issue 15, decision 0210; migration 0021),
and a trigger's reads go through ``fires_by_trigger`` — on a real SQLite file and a real PostgreSQL
database.

Why the key order is a contract: a SQLite write transaction appends every page it changes to the WAL,
whole. Keyed by trigger id first, each fire of a cycle sat on a leaf page of its own (trigger ids are
random) and each of its three writes (commit, claim, settlement) cost a page; keyed by tenant and
instant, a cycle's fires are neighbours. A later migration that put the trigger first again would
bring that cost back silently: these tests fail instead. The per-trigger reads must then use the
per-trigger index, never walk the tenant's history (plans read with ``EXPLAIN``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fireledger.domain.keys import FireKey
from fireledger.store import Store
from test_fire_indexes import _params

#: The named queries that read one trigger's fires: each must read fires_by_trigger.
PER_TRIGGER = ("hist_trigger_asc", "hist_trigger_desc", "hist_trigger_state_counts", "hist_lateness",
               "hist_recent_states", "list_fires", "bf_window", "gp_plan_fires", "gp_last_catch_up",
               "trust_count_fires_into", "trust_purge_fires", "console_recent_states", "tm_latest_tzdata",
               "attempts_of_trigger_range", "trust_purge_attempts")


def _plan(store: Any, name: str) -> str:
    """The plan of a named query (``EXPLAIN``; PostgreSQL with sequential scans priced out)."""
    sql = store.q[name]
    params = {**_params(sql), **{k: 0 for k in ("low", "skip", "cap", "n") if f":{k}" in sql or f"%({k})s" in sql}}
    with store.engine.read() as c:
        if store.engine_name == "postgres":
            c.execute("SET LOCAL enable_seqscan = off")
            return " ".join(str(r[0]) for r in c.execute("EXPLAIN " + sql, params).fetchall())
        return " ".join(str(r[-1]) for r in c.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall())


def _primary_key(store: Any, table: str) -> list[str]:
    with store.engine.read() as c:
        if store.engine_name == "postgres":
            rows = c.execute(
                "SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, n) "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
                "WHERE i.indrelid = CAST(%(t)s AS regclass) AND i.indisprimary ORDER BY k.n", {"t": table}).fetchall()
            return [str(r[0]) for r in rows]
        rows = c.execute(f"PRAGMA table_info({table})").fetchall()
        return [str(r[1]) for r in sorted((r for r in rows if r[5]), key=lambda r: r[5])]


def test_fires_and_attempts_are_keyed_by_tenant_then_instant(store):
    assert _primary_key(store, "fires") == ["tenant_id", "scheduled_us", "trigger_id", "seq"]
    assert _primary_key(store, "attempts") == ["tenant_id", "scheduled_us", "trigger_id", "seq", "attempt"]


def test_a_triggers_reads_use_the_per_trigger_index(store):
    for name in PER_TRIGGER:
        plan = _plan(store, name)
        assert "fires_by_trigger" in plan, (name, plan)


def test_a_tenants_history_reads_the_primary_key_in_order(store):
    """The key is the tenant's history order: no index of its own, no sort."""
    for name in ("hist_tenant_asc", "hist_tenant_desc"):
        plan = _plan(store, name)
        assert "fires_pkey" in plan if store.engine_name == "postgres" else "PRIMARY KEY" in plan, (name, plan)
        assert "TEMP B-TREE" not in plan and "Sort" not in plan, (name, plan)


def test_a_fires_attempts_are_probed_by_their_full_key(store):
    """A trigger's attempts are read through its fires: one probe per fire on the attempt key, not a
    walk of every attempt of the tenant in the range (SQLite would carry the instant range over to
    the attempts otherwise: the join says ``+f.scheduled_us``)."""
    plan = _plan(store, "attempts_of_trigger_range")
    if store.engine_name == "sqlite":
        assert "SEARCH a USING PRIMARY KEY (tenant_id=? AND scheduled_us=? AND trigger_id=? AND seq=?)" in plan, plan
    else:
        assert "attempts_pkey" in plan, plan


def test_sqlite_names_the_per_trigger_index_and_postgresql_text_leaves_it_out(store):
    """SQLite keeps no statistics: each per-trigger query names its index (preparing it fails if the
    index goes); PostgreSQL has no ``INDEXED BY`` clause and plans from statistics."""
    hinted = {n for n, sql in store.q.items() if "INDEXED BY" in sql.upper()}
    if store.engine_name == "sqlite":
        assert set(PER_TRIGGER) <= hinted, set(PER_TRIGGER) - hinted
    else:
        assert hinted == set()


def _version_of(engine: str, suffix: str) -> int:
    from importlib import resources

    tree = resources.files("fireledger.store").joinpath("sql", engine)
    [name] = [e.name for e in tree.iterdir() if e.name.endswith(suffix)]
    return int(name[:4])


_FIRE = ("INSERT INTO fires (tenant_id, trigger_id, scheduled_us, seq, version, kind, lane, state, decided_us, "
         "decided_by, tzdata_version, attempts, next_attempt_us, dispatched_us, finished_us) VALUES "
         "('tn_k', :trigger_id, :s, 0, 1, 'scheduled', 'on-time', :state, :s, 'node-a', '2025a', :n, :s, :d, :d)")
_ATTEMPT = ("INSERT INTO attempts (tenant_id, trigger_id, scheduled_us, seq, attempt, started_us, finished_us, "
            "result, http_status, node) VALUES ('tn_k', :trigger_id, :s, 0, 1, :s, :s, 'delivered', 200, 'node-a')")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_migration_keeps_every_fire_and_attempt(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     request: pytest.FixtureRequest) -> None:
    import fireledger.store.root as store_root
    from fireledger.store.engine import engine_for_url, migration_files

    pg: Any = request.getfixturevalue("pg_server") if kind == "postgres" else None
    monkeypatch.setenv("FIRELEDGER_KEK", "A" * 43 + "=")
    url = f"sqlite:///{tmp_path}/store.db" if kind == "sqlite" else pg.new_database()
    version = _version_of(kind, "_fires_keyed_by_instant.sql")
    with monkeypatch.context() as m:
        m.setattr(store_root, "migration_files", lambda engine: [f for f in migration_files(engine) if f[0] < version])
        old = Store(engine_for_url(url))
        old.migrate()
    rows = [("tr_b", 3_000, "delivered", 1), ("tr_a", 2_000, "pending", 0), ("tr_a", 1_000, "delivered", 1)]
    try:
        with old.engine.write() as c:
            for trigger_id, s, state, n in rows:
                p = {"trigger_id": trigger_id, "s": s, "state": state, "n": n, "d": s if n else None}
                c.execute(old.engine.sql(_FIRE), p)
                if n:
                    c.execute(old.engine.sql(_ATTEMPT), p)
    finally:
        old.close()
    store = Store(engine_for_url(url))
    try:
        store.migrate()
        fires = store.history.list_fires("tn_k", "tr_a")
        got = store.history.get_fire(FireKey("tn_k", "tr_b", 3_000, 0))
    finally:
        store.close()
    assert [(f.scheduled_us, f.state.value, len(f.attempt_list)) for f in fires] == [(1_000, "delivered", 1),
                                                                                 (2_000, "pending", 0)]
    assert got is not None and [a.number for a in got.attempt_list] == [1]


def test_a_new_sqlite_database_has_small_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    """Decision 0211: 1 KiB pages for a new file (WAL bytes per fire); a file made with SQLite's
    default 4 KiB pages keeps them (WAL mode cannot change the size) and works as before."""
    from fireledger.store.engine import NEW_DATABASE_PAGE_SIZE
    from fireledger.store.sqlitelib import sqlite3

    new = Store.open(f"sqlite:///{tmp_path}/new.db")
    try:
        with new.engine.read() as c:
            assert c.execute("PRAGMA page_size").fetchone()[0] == NEW_DATABASE_PAGE_SIZE == 1024
    finally:
        new.close()
    conn = sqlite3.connect(tmp_path / "old.db")
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE placeholder (x)")
    conn.close()
    old = Store.open(f"sqlite:///{tmp_path}/old.db")
    try:
        with old.engine.read() as c:
            assert c.execute("PRAGMA page_size").fetchone()[0] == 4096
        assert old.history.list_fires("tn_none", "tr_none") == []
    finally:
        old.close()
