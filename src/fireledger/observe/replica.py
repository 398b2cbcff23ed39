"""The health of the embedded store's Litestream replica, for ``/metrics`` (issue 16; decision 0200).

``fireledger serve`` with ``FIRELEDGER_REPLICA`` registers a :class:`ReplicaCollector`; every scrape
reads the file system (no socket, no child process), so the figures hold whatever Litestream's state:

* ``fireledger_replica_up`` — 1 while the supervised ``litestream replicate`` child runs and the
  replica directory can be read; 0 otherwise (the child died and waits for its restart, the
  directory vanished or is unreadable).
* ``fireledger_replica_lag_seconds`` — how far the replica is behind what Litestream has read from
  the database: 0 when the replica holds Litestream's newest transaction and the child runs;
  otherwise the age of the newest transaction the replica holds (time since the last sync that
  reached it). Litestream 0.5 writes one LTX file per transaction it ships
  (``<replica>/ltx/<level>/<min txid>-<max txid>.ltx``, its modification time stamped with the
  transaction's capture time) and keeps the ones it read locally beside the database
  (``.<name>-litestream/ltx/0/``): the two positions are the highest transaction ids of each.
  A replica that has never received a file reads ``+Inf`` while the database has transactions.
* ``fireledger_replica_sync_interval_seconds`` — ``FIRELEDGER_REPLICA_SYNC_S``, the declared RPO, so
  that the alert rule compares the lag with ten of it whatever the setting.

A Litestream that runs but does not read the database (hung) is caught by the WAL: written more than
``unread_grace_s`` after Litestream's newest local file, the lag is the replica's age again (``serve``
commits every second or so — lease renewals, heartbeats — so a live store's WAL keeps moving).
Not seen: commits younger than that grace. The alert rule (deploy/prometheus/alerts.yml) pages on lag above ten
sync intervals for a minute, and raises a ticket on ``up`` 0 for five.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

LAG = "fireledger_replica_lag_seconds"
UP = "fireledger_replica_up"
SYNC = "fireledger_replica_sync_interval_seconds"


@dataclass(frozen=True, slots=True)
class Position:
    """The highest transaction id among a directory's LTX files and the capture time (file
    modification time, wall clock) of the file holding it."""

    txid: int
    at: float


def newest_ltx(folder: Path) -> Position | None:
    """The newest transaction among ``folder/ltx/*/*.ltx`` (every compaction level); None when there
    is none. ``OSError`` when ``folder`` cannot be read; files removed while reading are skipped."""
    best: Position | None = None
    ltx = folder / "ltx"
    if not folder.is_dir():
        raise FileNotFoundError(str(folder))
    if not ltx.is_dir():
        return None
    for level in ltx.iterdir():
        if not level.is_dir():
            continue
        for f in level.iterdir():
            if f.suffix != ".ltx":
                continue
            try:
                txid = int(f.stem.rsplit("-", 1)[-1], 16)
                at = f.stat().st_mtime
            except (ValueError, OSError):
                continue
            if best is None or txid > best.txid or (txid == best.txid and at > best.at):
                best = Position(txid, at)
    return best


def local_meta(db_path: str) -> Path:
    """Litestream's local directory of a database: ``.<name>-litestream`` beside it."""
    db = Path(db_path)
    return db.parent / f".{db.name}-litestream"


@dataclass(frozen=True, slots=True)
class ReplicaReading:
    """One reading: ``up`` and ``lag_s`` (module docstring)."""

    up: bool
    lag_s: float


def _wal_written_at(db_path: str) -> float:
    """The modification time of the database's WAL (its newest commit); 0 when there is none."""
    try:
        return Path(db_path + "-wal").stat().st_mtime
    except OSError:
        return 0.0


def read_replica(db_path: str, replica: Path, running: bool, now: float | None = None,
                 unread_grace_s: float = 2.0) -> ReplicaReading:
    """Compare Litestream's local position with the replica's (module docstring); a WAL written
    more than ``unread_grace_s`` after Litestream's newest local file means Litestream is not
    reading the database (hung): the replica is then as old as its newest transaction."""
    now = time.time() if now is None else now
    try:
        remote = newest_ltx(replica)
    except OSError:
        return ReplicaReading(False, math.inf)
    try:
        local = newest_ltx(local_meta(db_path))
    except OSError:
        local = None
    if remote is None:
        return ReplicaReading(running, math.inf if local is not None else 0.0)
    reading = local is None or _wal_written_at(db_path) <= local.at + unread_grace_s
    if running and reading and (local is None or remote.txid >= local.txid):
        return ReplicaReading(True, 0.0)
    return ReplicaReading(running, max(0.0, now - remote.at))


class ReplicaCollector:
    """``fireledger_replica_up`` and ``fireledger_replica_lag_seconds`` read at scrape time;
    ``running`` says whether the Litestream child is alive (the supervisor's view)."""

    def __init__(self, db_path: str, replica: Path, running: Callable[[], bool], sync_s: float) -> None:
        self.db_path = db_path
        self.replica = replica
        self.running = running
        self.sync_s = sync_s

    def describe(self) -> list[Metric]:
        return []   # unchecked collector: families are produced at scrape time

    def collect(self) -> Iterator[Metric]:
        reading = read_replica(self.db_path, self.replica, self.running(),
                               unread_grace_s=max(2.0, 2 * self.sync_s))
        up = GaugeMetricFamily(UP, "1 while Litestream runs and the replica directory can be read")
        up.add_metric([], 1.0 if reading.up else 0.0)
        lag = GaugeMetricFamily(LAG, "Seconds the Litestream replica is behind the database "
                                     "(time since the last sync that reached it; 0: current)")
        lag.add_metric([], reading.lag_s)
        sync = GaugeMetricFamily(SYNC, "The declared sync interval (FIRELEDGER_REPLICA_SYNC_S): the RPO")
        sync.add_metric([], self.sync_s)
        yield up
        yield lag
        yield sync
