"""``bench/benchkit.py`` ``Stores.fresh`` retires the store it returned before (decision 0255): a
run must not pay for its predecessor's WAL flush or for the autovacuum of its tables. Real SQLite
files and the test run's real PostgreSQL server; no benchmark runs here."""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
_saved = list(sys.path)
sys.path.append(str(ROOT / "bench"))
import benchkit  # noqa: E402

sys.path[:] = _saved   # bench/ module names must not shadow the tests' helpers (sink, …)


def test_a_fresh_sqlite_store_deletes_the_previous_file_and_its_wal(tmp_path):
    stores = benchkit.Stores(tmp_path)
    try:
        url1, db1 = stores.fresh("sqlite-serve", "one")
        assert url1 == f"sqlite:///{db1}" and db1 is not None
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db1}{suffix}").write_bytes(b"x")
        keep = tmp_path / "other.db"
        keep.write_bytes(b"y")
        _, db2 = stores.fresh("sqlite-split", "two")
        assert db2 is not None and db2 != db1
        assert not any(Path(f"{db1}{s}").exists() for s in ("", "-wal", "-shm"))
        assert keep.exists()   # only the store fresh() made is retired
    finally:
        stores.close()


def _databases(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as c:
        return {str(r[0]) for r in c.execute("SELECT datname FROM pg_database")}


def test_a_fresh_postgres_database_drops_the_previous_one(tmp_path, pg_server):
    stores = benchkit.Stores(tmp_path)
    stores._pg = pg_server   # the test run's server, not a second one
    url1, none = stores.fresh("postgres-split", "one")
    assert none is None
    name1 = psycopg.conninfo.conninfo_to_dict(url1)["dbname"]
    left_open = psycopg.connect(url1, autocommit=True)   # a connection left open does not stop the drop (FORCE)
    assert left_open.execute("SELECT count(*) FROM fires").fetchone() == (0,)
    url2, _ = stores.fresh("postgres-split", "two")
    left_open.close()
    name2 = psycopg.conninfo.conninfo_to_dict(url2)["dbname"]
    names = _databases(pg_server.url)
    assert name1 not in names and name2 in names
    with psycopg.connect(url2) as c:   # the new one is migrated
        assert c.execute("SELECT count(*) FROM fires").fetchone() == (0,)
