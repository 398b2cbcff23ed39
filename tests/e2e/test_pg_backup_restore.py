"""A PostgreSQL backup you have restored (issue 16 item 4; decision 0190).

Real parts only: a PostgreSQL server started by the test with ``archive_mode = on`` and an
``archive_command`` copying into a directory; ``fireledger serve`` writing a real ledger (three
1 s triggers, a local sink); ``fireledger backup`` (``pg_basebackup -X stream``) taken while it
fires; more fires; a WAL switch archived; then ``fireledger restore --to-pgdata`` twice into fresh
data directories — from the base backup alone, and with ``--wal-archive`` replay — each started as a
second PostgreSQL on its own port, where ``fireledger audit verify`` and the shadow rebuilder
(``fireledger due-index rebuild``: nothing to add, remove or change) pass and every fire committed
before the backup (with replay: before the archive point) is present. Bad input: one line naming
the field, exit 2, nothing written.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from e2e import Api, Service, cli, free_port, new_tenant, verify_target, wait_until
from pgserver import PG_USER, PgServer, find_bin_dir
from sink import SinkServer

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(240)]

IS_ROOT = os.geteuid() == 0
AS_PG = ["runuser", "-u", PG_USER, "--"] if IS_ROOT else []


def _pg_reachable_dir(prefix: str) -> Path:
    """A fresh directory the PostgreSQL OS user can write (as root: in /tmp, owned by postgres)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp" if IS_ROOT else None))
    if IS_ROOT:
        pw = pwd.getpwnam(PG_USER)
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


@pytest.fixture
def archived_pg() -> Iterator[tuple[PgServer, Path]]:
    """A private server that archives every finished WAL segment into a directory."""
    archive = _pg_reachable_dir("fireledger-walarchive-")
    conf = f"archive_mode = on\narchive_command = 'test ! -f {archive}/%f && cp %p {archive}/%f'\n"
    server = PgServer.start(max_connections=60, extra_conf=conf)
    try:
        yield server, archive
    finally:
        server.close()
        shutil.rmtree(archive, ignore_errors=True)


def _fires(url: str) -> set[tuple[str, int]]:
    with psycopg.connect(url, connect_timeout=10) as conn:
        return {(r[0], r[1]) for r in conn.execute("SELECT trigger_id, scheduled_us FROM fires").fetchall()}


def _with_port(url: str, server: PgServer) -> str:
    """``url`` (a database on the source) on the restored ``server`` instead."""
    return server.url.rsplit("/", 1)[0] + "/" + url.rsplit("/", 1)[1]


def _start_restored(root: Path, port: int) -> PgServer:
    """Start PostgreSQL on the restored ``root/data`` and wait (with a deadline) until it has finished
    recovery and accepts writes; ``close()`` stops it and deletes ``root``."""
    server = PgServer._launch(find_bin_dir(), root / "data", root, port, AS_PG)
    if server is None:
        raise AssertionError("the restored server exited: " + (root / "postgres.log").read_text()[-3000:])

    def promoted() -> bool:
        with psycopg.connect(server.url, connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return row is not None and row[0] is False

    try:
        wait_until(promoted, 60, "the restored server to finish recovery")
    except BaseException:
        server.close()
        raise
    return server


def _check_restored(url: str) -> None:
    """``fireledger audit verify`` and the shadow rebuilder pass on the restored store."""
    assert "audit chain intact" in cli("audit", "verify", "--db", url).stdout
    rebuilt = json.loads(cli("due-index", "rebuild", "--db", url, "--json").stdout)
    assert rebuilt["triggers"] == 3 and rebuilt["rows"] == 3, rebuilt
    assert (rebuilt["added"], rebuilt["removed"], rebuilt["changed"]) == (0, 0, 0), rebuilt


def _write_ledger(db: str, tmp_path: Path, sink: SinkServer) -> Service:
    svc = Service(db, tmp_path).start()
    _, token = new_tenant(db)
    api = Api(svc.base, token)
    target = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/ok"}, 201)
    sink.add_secret(target["secret"])
    verify_target(api, sink, target)
    for i in range(3):
        api.ok("POST", "/v1/triggers", {"name": f"pg{i}", "schedule": {"every": "1s"},
                                         "target_id": target["id"], "payload": {"i": i}}, 201)
    return svc


def _decided(url: str) -> dict[tuple[str, int], int]:
    """Every fire's key (trigger, instant) and when it was decided (µs)."""
    with psycopg.connect(url, connect_timeout=10) as conn:
        rows = conn.execute("SELECT trigger_id, scheduled_us, decided_us FROM fires").fetchall()
    return {(r[0], r[1]): r[2] for r in rows}


def _restore_and_start(backup: Path, prefix: str, *extra: str) -> tuple[PgServer, Path, dict[str, object]]:
    """``fireledger restore --to-pgdata`` into a fresh directory on a free port, then start it there."""
    root, port = _pg_reachable_dir(prefix), free_port()
    try:
        summary = json.loads(cli("restore", "--from", str(backup), "--to-pgdata", str(root / "data"),
                                 "--port", str(port), *extra, "--json").stdout)
        data = root / "data"
        assert summary["restored"] == str(data) and data.stat().st_mode & 0o077 == 0
        if IS_ROOT:   # PostgreSQL never runs as root: the directory is handed to its OS user
            assert summary["owner"] == PG_USER and data.stat().st_uid == pwd.getpwnam(PG_USER).pw_uid
        auto_conf = (data / "postgresql.auto.conf").read_text()
        assert f"port = {port}" in auto_conf and "archive_mode = off" in auto_conf
        assert (data / "recovery.signal").exists() == ("--wal-archive" in extra)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return _start_restored(root, port), root, summary


def _check_manifest(backup: Path, fmt: str) -> None:
    manifest = json.loads((backup / "manifest.json").read_text())
    assert manifest["kind"] == "fireledger-postgresql-base-backup" and manifest["format"] == fmt
    assert manifest["wal"] == "stream" and manifest["schema_version"] >= 1
    assert manifest["server_version_num"] >= 100000 and manifest["pg_basebackup"].startswith("pg_basebackup")
    assert "s3cret-pw" not in json.dumps(manifest)
    assert manifest["source"].startswith("postgresql://postgres" + (":***@" if fmt == "tar" else "@"))
    if fmt == "tar":
        assert (backup / "base" / "base.tar.gz").is_file() and (backup / "base" / "pg_wal.tar.gz").is_file()
    else:
        assert (backup / "base" / "PG_VERSION").is_file()
    assert backup.stat().st_mode & 0o077 == 0   # it holds sealed secrets: owner only


def _live_history(db: str, tmp_path: Path, archive: Path) -> dict[str, object]:
    """``serve`` fires while a plain and a tar backup are taken; a recovery target time is noted
    between later fires; ``serve`` stops and the WAL is switched and archived (the archive point)."""
    sink = SinkServer()
    sink.start_in_thread()
    svc = _write_ledger(db, tmp_path, sink)
    try:
        wait_until(lambda: len(_fires(db)) >= 6, 30, "six fires before the backups")
        h: dict[str, object] = {"before_backup": _fires(db)}
        backups = tmp_path / "backups"
        h["plain"] = json.loads(cli("backup", "--to", str(backups), "--db", db, "--format", "plain",
                                    "--json").stdout)["backup"]
        with_password = db.replace("postgres@", "postgres:s3cret-pw@", 1)   # trust auth ignores it
        h["tar"] = json.loads(cli("backup", "--to", str(backups), "--db", with_password, "--json").stdout)["backup"]
        n = len(_fires(db))
        wait_until(lambda: len(_fires(db)) >= n + 3, 30, "three more fires after the backups")
        h["before_target"] = _fires(db)
        h["target_us"] = target_us = time.time_ns() // 1000
        h["target"] = datetime.fromtimestamp(target_us / 1e6, UTC).isoformat()
        wait_until(lambda: [k for k, d in _decided(db).items() if d > target_us + 500_000][2:], 30,
                   "three fires decided after the recovery target")
    finally:
        svc.stop()
        sink.stop()
    h["at_archive_point"] = _fires(db)
    h["decided"] = _decided(db)
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT pg_walfile_name(pg_switch_wal())").fetchone()
    assert row is not None
    wait_until(lambda: (archive / row[0]).exists(), 30, f"WAL segment {row[0]} in the archive")
    return h


def _corrupt_copy_is_refused(plain: Path, tmp_path: Path) -> None:
    """A backup whose files no longer match its backup_manifest fails pg_verifybackup: exit 1, and the
    new data directory is gone again."""
    bad = tmp_path / "corrupt" / plain.name
    shutil.copytree(plain, bad, symlinks=True)
    with open(bad / "base" / "PG_VERSION", "a") as f:
        f.write("tampered\n")
    proc = cli("restore", "--from", str(bad), "--to-pgdata", str(tmp_path / "corrupt-data"), check=False)
    assert proc.returncode == 1, proc.stderr
    assert "fireledger: restore: --from: pg_verifybackup failed" in proc.stderr, proc.stderr
    assert not (tmp_path / "corrupt-data").exists()


def test_a_live_postgresql_backup_restores_with_and_without_wal_replay(archived_pg, tmp_path):
    source, archive = archived_pg
    db = source.new_database("fl_pgrestore")
    cli("db", "upgrade", "--db", db)
    h: dict[str, Any] = _live_history(db, tmp_path, archive)
    plain, tar = Path(h["plain"]), Path(h["tar"])
    _check_manifest(plain, "plain")
    _check_manifest(tar, "tar")
    _corrupt_copy_is_refused(plain, tmp_path)

    # 1. a base backup alone (plain format): every fire committed before it began
    server, _, summary = _restore_and_start(plain, "fireledger-restored-a-")
    try:
        assert summary["wal_archive"] is None
        fires_a = _fires(_with_port(db, server))
        assert h["before_backup"] <= fires_a <= h["at_archive_point"]
        _check_restored(_with_port(db, server))
    finally:
        server.close()

    # 2. the tar backup and the WAL archive replayed: every fire committed before the archive point
    server, _, summary = _restore_and_start(tar, "fireledger-restored-b-", "--wal-archive", str(archive))
    try:
        assert summary["wal_archive"] == str(archive.resolve())
        assert h["at_archive_point"] <= _fires(_with_port(db, server))
        assert h["at_archive_point"] - fires_a, "the archive held no commit the base backup lacked"
        _check_restored(_with_port(db, server))
    finally:
        server.close()

    # 3. replay up to a point in time: what was committed before it, nothing decided after it
    server, _, summary = _restore_and_start(tar, "fireledger-restored-c-", "--wal-archive", str(archive),
                                            "--recovery-target-time", h["target"])
    try:
        fires_c = _fires(_with_port(db, server))
        after = {k for k, d in h["decided"].items() if d > h["target_us"]}
        assert h["before_target"] <= fires_c and after and not fires_c & after
        _check_restored(_with_port(db, server))
    finally:
        server.close()
    assert not any(archive.glob("00000002*")), "a restored copy archived into its source's archive"


def _fake_pg_backup(path: Path) -> Path:
    """A directory shaped like a PostgreSQL backup, enough for the input checks (which come first)."""
    (path / "base").mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"kind": "fireledger-postgresql-base-backup", "format": "tar"}))
    return path


def test_postgresql_backup_and_restore_refuse_bad_input(tmp_path):
    backup = _fake_pg_backup(tmp_path / "pgbackup")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "PG_VERSION").write_text("15\n")
    sqlite_file = tmp_path / "sqlite-backup.db"
    sqlite_file.write_text("not a postgres backup")
    new = str(tmp_path / "new")
    cases = {
        "--format": ["backup", "--to", str(tmp_path / "b"), "--db", "postgresql://127.0.0.1:1/x", "--format", "zip"],
        "--db": ["backup", "--to", str(tmp_path / "b"), "--db", "postgresql://postgres@127.0.0.1:1/x"],
        "--to-pgdata": ["restore", "--from", str(backup)],
        "--from": ["restore", "--from", str(sqlite_file), "--to-pgdata", new],
        "--port": ["restore", "--from", str(backup), "--to-pgdata", new, "--port", "0"],
        "--wal-archive": ["restore", "--from", str(backup), "--to-pgdata", new, "--wal-archive", str(tmp_path / "no")],
        "--recovery-target-time": ["restore", "--from", str(backup), "--to-pgdata", new, "--wal-archive",
                                   str(tmp_path), "--recovery-target-time", "yesterday"],
    }
    cases["--to"] = ["restore", "--from", str(backup), "--to-pgdata", new, "--to", str(tmp_path / "s.db")]
    cases["sqlite --port"] = ["restore", "--from", str(sqlite_file), "--to", str(tmp_path / "s.db"), "--port", "5433"]
    cases["sqlite --format"] = ["backup", "--to", str(tmp_path / "b"), "--db", f"sqlite:///{tmp_path}/x.db",
                                "--format", "plain"]
    for case, args in cases.items():
        field = case.removeprefix("sqlite ")
        proc = cli(*args, check=False)
        assert proc.returncode == 2, (case, proc.stderr)
        assert proc.stderr.startswith(f"fireledger: {args[0]}: {field}: "), (case, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    busy = cli("restore", "--from", str(backup), "--to-pgdata", str(tmp_path / "busy"), check=False)
    assert busy.returncode == 2 and busy.stderr.startswith("fireledger: restore: --to-pgdata: "), busy.stderr
    no_archive = cli("restore", "--from", str(backup), "--to-pgdata", new, "--recovery-target-time",
                     "2026-01-01T00:00:00Z", check=False)
    assert no_archive.returncode == 2 and "--recovery-target-time: needs --wal-archive" in no_archive.stderr
    assert not (tmp_path / "new").exists() and not (tmp_path / "b").exists() and not (tmp_path / "s.db").exists()
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["PG_VERSION"]
