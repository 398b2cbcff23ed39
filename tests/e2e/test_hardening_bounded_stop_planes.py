"""Hardening (issue 13, high #2), class: **bounded stop** — each plane run alone (``fireledger
timing``, ``control``, ``dispatch``), on SIGTERM and on SIGINT, in a busy state (red team, decision
0092). The serve-only members are in test_hardening_bounded_stop.py.

Busy states: ``dispatch`` with attempts held open by a target that never answers; ``timing`` while
another process holds SQLite's write lock (its commit is waiting); ``control`` with a request whose
body is still arriving and another waiting on the locked store.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from e2e import Api, Service, new_tenant, verify_target, wait_until
from fireledger.stopping import STOP_TIMEOUT_ENV
from fireledger.store.sqlitelib import sqlite3
from sink import SinkServer

pytestmark = pytest.mark.e2e

STOP_S = 4
MARGIN_S = 3.0


@pytest.fixture
def sink():
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


def signal_and_time_exit(svc: Service, sig: signal.Signals) -> float:
    assert svc.proc is not None
    sent = time.monotonic()
    os.killpg(svc.proc.pid, sig)
    try:
        svc.proc.wait(timeout=STOP_S + MARGIN_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{svc.command} still running {STOP_S + MARGIN_S:g}s after {sig.name} "
                             f"(bound {STOP_S}s); log tail: {svc.log_text()[-1500:]}") from None
    return time.monotonic() - sent


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_bounded_stop_each_plane_alone_in_a_busy_state(sig: signal.Signals, sink: SinkServer, tmp_path) -> None:
    db_path = tmp_path / "fl.db"
    db = f"sqlite:///{db_path}"
    env = {STOP_TIMEOUT_ENV: str(STOP_S)}
    control = Service(db, tmp_path, command="control", env=env).start()
    timing = Service(db, tmp_path, command="timing", env=env).start()
    dispatch = Service(db, tmp_path, command="dispatch", env=env).start()
    lock: sqlite3.Connection | None = None
    slow: socket.socket | None = None
    try:
        _, token = new_tenant(db, "stopper")
        api = Api(control.base, token)
        tg = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/hang"}, 201)
        sink.add_secret(tg["secret"])
        verify_target(api, sink, tg)
        api.ok("POST", "/v1/triggers", {"name": "hang", "schedule": {"every": "1s"}, "target_id": tg["id"],
                                        "timeout": "5m"}, 201)
        wait_until(lambda: sum(1 for r in sink.records() if r["path"] == "/hang") >= 3, 30,
                   "attempts held open by the target")
        # dispatch: attempts in flight.
        assert signal_and_time_exit(dispatch, sig) <= STOP_S + MARGIN_S
        # control: a body still arriving, and a request waiting on a store another process locked.
        slow = socket.create_connection(("127.0.0.1", control.port), timeout=10)
        slow.sendall(f"POST /v1/triggers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode())
        lock = sqlite3.connect(db_path, timeout=30, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")   # the write lock, held until the end of the test
        waiting = threading.Thread(target=lambda: Api(control.base, token).call(
            "POST", "/v1/triggers", {"name": "w", "schedule": {"every": "1h"}, "target_id": tg["id"]}), daemon=True)
        waiting.start()
        assert signal_and_time_exit(control, sig) <= STOP_S + MARGIN_S
        # timing: its next commit waits on the lock.
        assert signal_and_time_exit(timing, sig) <= STOP_S + MARGIN_S
    finally:
        if slow is not None:
            slow.close()
        if lock is not None:
            lock.rollback()
            lock.close()
        for svc in (dispatch, timing, control):
            svc.stop()
