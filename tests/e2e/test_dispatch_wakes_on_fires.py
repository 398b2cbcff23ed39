"""Decision 0221: on PostgreSQL split planes a ``fireledger dispatch`` process is woken by the timing
plane's commit (``LISTEN fireledger_fires``), not by its idle poll. Decision 0256: on SQLite split
planes the same, through the fires bell (``<db>-fires.bell``).

Real processes (control, timing, dispatch) on the throwaway PostgreSQL server, or on one SQLite
file. The dispatcher's idle poll is made LONG (``FIRELEDGER_DISPATCH_IDLE_S=60``: it sleeps 30–60 s
with nothing to claim), so after its first claim at start-up it cannot claim again by polling for
30 s. A trigger of 1 s created once it watches must nevertheless have three fires delivered well
inside that window: only the wake-up can have started them (a count against the earliest possible
poll, not a tight timer).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2e import Api, Service, cli, new_tenant, verify_target, wait_until
from fireledger.store.firesbell import SUFFIX as BELL_SUFFIX
from fireledger.store.listen import FIRES_CHANNEL
from sink import SinkServer

pytestmark = [pytest.mark.e2e]

IDLE_S = 60.0
#: The earliest a dispatcher's idle poll can follow its start-up claim (``idle_s`` × 0.5).
EARLIEST_POLL_S = IDLE_S * 0.5


@pytest.fixture
def sink() -> Iterator[SinkServer]:
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


def _listeners(url: str) -> int:
    """Sessions of this database whose last statement was ``LISTEN fireledger_fires``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND query = %s", (f"LISTEN {FIRES_CHANNEL}",)).fetchone()
    return int(row[0]) if row else 0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def split_db(request, tmp_path) -> tuple[str, Callable[[], bool]]:
    """``(url, watching)``: a migrated store and a test of whether a dispatcher watches it for fires
    (PostgreSQL: a session is in ``LISTEN``; SQLite: the bell exists, made only by a watcher before
    any fire is committed)."""
    if request.param == "sqlite":
        path = tmp_path / "split.db"
        url = f"sqlite:///{path}"
        cli("db", "upgrade", "--db", url)
        bell = Path(f"{path}{BELL_SUFFIX}")
        assert not bell.exists()
        return url, bell.exists
    url = str(request.getfixturevalue("pg_server").new_database())
    cli("db", "upgrade", "--db", url)
    return url, lambda: _listeners(url) >= 1


def test_a_split_dispatcher_starts_committed_fires_long_before_its_idle_poll(split_db, sink, tmp_path) -> None:
    db, watching = split_db
    control = Service(db, tmp_path, command="control").start()
    timing = Service(db, tmp_path, command="timing").start()
    dispatch = None
    try:
        _, token = new_tenant(db)
        api = Api(control.base, token)
        tg = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/wake"}, 201)
        sink.add_secret(tg["secret"])
        verify_target(api, sink, tg)
        spawned = time.monotonic()   # the dispatcher's start-up claim comes after this
        dispatch = Service(db, tmp_path, command="dispatch", env={"FIRELEDGER_DISPATCH_IDLE_S": str(IDLE_S)}).start()
        wait_until(watching, 20, "the dispatcher to watch for fires")
        api.ok("POST", "/v1/triggers", {"name": "w", "schedule": {"every": "1s"}, "target_id": tg["id"]}, 201)
        window = EARLIEST_POLL_S - (time.monotonic() - spawned)
        assert window > 5, "the processes took too long to start for the test to tell anything"
        wait_until(lambda: sum(1 for r in sink.records() if r["path"] == "/wake") >= 3, window - 1,
                   "three fires delivered before the dispatcher's idle poll could have claimed one")
        assert time.monotonic() - spawned < EARLIEST_POLL_S
        assert dispatch.proc is not None and dispatch.proc.poll() is None
    finally:
        for svc in (dispatch, timing, control):
            if svc is not None:
                svc.stop()
