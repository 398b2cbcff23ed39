"""``fireledger.observe.replica.read_replica`` on real directories laid out as Litestream 0.5 lays
them out (``ltx/<level>/<min>-<max>.ltx``, modification time = the transaction's capture time):
each branch of the reading (decision 0200). The whole path, with a real Litestream under a real
``serve``, is tests/e2e/test_replica_health.py."""

from __future__ import annotations

import math
import os
from pathlib import Path

from fireledger.observe.replica import local_meta, newest_ltx, read_replica

NOW = 1_800_000_000.0


def _ltx(folder: Path, level: int, txid: int, at: float) -> None:
    d = folder / "ltx" / str(level)
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"{1:016x}-{txid:016x}.ltx"
    f.write_bytes(b"LTX1")
    os.utime(f, (at, at))


def _layout(tmp_path: Path, local_txid: int, local_at: float, remote_txid: int | None, remote_at: float,
            wal_at: float | None = None) -> tuple[str, Path]:
    db = tmp_path / "fl.db"
    db.write_bytes(b"")
    _ltx(local_meta(str(db)), 0, local_txid, local_at)
    replica = tmp_path / "replica"
    replica.mkdir()
    if remote_txid is not None:
        _ltx(replica, 0, remote_txid, remote_at)
        _ltx(replica, 9, 1, remote_at - 100)   # a snapshot level: older, lower txid
    if wal_at is not None:
        wal = Path(f"{db}-wal")
        wal.write_bytes(b"")
        os.utime(wal, (wal_at, wal_at))
    return str(db), replica


def test_current_replica_reads_zero(tmp_path):
    db, rep = _layout(tmp_path, 0x2A, NOW - 30, 0x2A, NOW - 30, wal_at=NOW - 30)
    assert newest_ltx(rep) is not None and newest_ltx(rep).txid == 0x2A
    r = read_replica(db, rep, running=True, now=NOW)
    assert (r.up, r.lag_s) == (True, 0.0)


def test_replica_behind_local_reads_its_age(tmp_path):
    db, rep = _layout(tmp_path, 50, NOW - 1, 40, NOW - 12.5)
    r = read_replica(db, rep, running=True, now=NOW)
    assert (r.up, r.lag_s) == (True, 12.5)


def test_dead_child_reads_down_and_the_replica_age(tmp_path):
    db, rep = _layout(tmp_path, 40, NOW - 7, 40, NOW - 7)
    r = read_replica(db, rep, running=False, now=NOW)
    assert (r.up, r.lag_s) == (False, 7.0)


def test_hung_litestream_is_seen_through_the_wal(tmp_path):
    # The WAL moved on 5 s after Litestream's newest local file: it stopped reading the database.
    db, rep = _layout(tmp_path, 40, NOW - 9, 40, NOW - 9, wal_at=NOW - 4)
    assert read_replica(db, rep, running=True, now=NOW, unread_grace_s=2).lag_s == 9.0
    assert read_replica(db, rep, running=True, now=NOW, unread_grace_s=6).lag_s == 0.0


def test_missing_replica_directory_reads_down(tmp_path):
    db, rep = _layout(tmp_path, 40, NOW - 1, None, 0)
    assert read_replica(db, rep, running=True, now=NOW).lag_s == math.inf   # nothing shipped yet
    rep.rmdir()
    r = read_replica(db, rep, running=True, now=NOW)
    assert (r.up, r.lag_s) == (False, math.inf)
