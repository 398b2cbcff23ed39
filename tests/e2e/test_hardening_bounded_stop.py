"""Hardening (issue 13, high #2), class: **bounded stop** (DESIGN.md invariant 17). Every process
exits within ``FIRELEDGER_STOP_TIMEOUT_S`` of SIGTERM whatever its state.

With real ``fireledger serve`` processes: attempts held open by a target that never answers, a
target that answered ``503`` with an absurd ``Retry-After`` (which froze the attempt runner's
recording before), and a registered internal callable that blocks its thread for ever (which kept
the interpreter from exiting). The process is sent SIGTERM and must be gone within the bound; the
exit is polled with a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import threading
import time

import pytest

from e2e import Api, Service, new_tenant, verify_target, wait_until
from fireledger.stopping import FORCED_EXIT_STATUS, STOP_TIMEOUT_ENV, stop_timeout_s
from sink import SinkServer

pytestmark = pytest.mark.e2e

STOP_S = 4
MARGIN_S = 3.0   # process teardown and the interpreter's own exit, beyond the declared bound


@pytest.fixture
def sink():
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


def at_in(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))


def sigterm_and_time_exit(svc: Service) -> float:
    """SIGTERM the service; seconds until it exited (raises when it outlives bound + margin)."""
    assert svc.proc is not None
    sent = time.monotonic()
    os.killpg(svc.proc.pid, signal.SIGTERM)
    try:
        svc.proc.wait(timeout=STOP_S + MARGIN_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{svc.command} still running {STOP_S + MARGIN_S:g}s after SIGTERM "
                             f"(bound {STOP_S}s); log tail: {svc.log_text()[-1500:]}") from None
    return time.monotonic() - sent


def test_stop_timeout_setting_is_validated() -> None:
    assert stop_timeout_s({}) == 10.0
    assert stop_timeout_s({STOP_TIMEOUT_ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "nan", "inf", "soon", "601"):
        with pytest.raises(ValueError, match=STOP_TIMEOUT_ENV):
            stop_timeout_s({STOP_TIMEOUT_ENV: bad})


def test_serve_stops_in_time_with_attempts_in_flight_and_a_poisoned_retry_after(db, sink, tmp_path) -> None:
    svc = Service(db, tmp_path, env={STOP_TIMEOUT_ENV: str(STOP_S)}).start()
    try:
        _, token = new_tenant(db, "poisoner")
        api = Api(svc.base, token)
        ids = {}
        for path, schedule in (("/retry-after/10000000000000", {"at": at_in(2)}), ("/hang", {"every": "1s"})):
            tg = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}{path}"}, 201)
            sink.add_secret(tg["secret"])
            verify_target(api, sink, tg)
            ids[path] = api.ok("POST", "/v1/triggers", {"name": path.strip("/").replace("/", "-"),
                                                        "schedule": schedule, "target_id": tg["id"],
                                                        "timeout": "5m"}, 201)["id"]
        # The 503 with the absurd Retry-After answered, and several attempts held open by /hang.
        wait_until(lambda: any(r["path"].startswith("/retry-after/") for r in sink.records())
                   and sum(1 for r in sink.records() if r["path"] == "/hang") >= 3, 30,
                   "the poisoned answer and attempts in flight")
        took = sigterm_and_time_exit(svc)
        assert took <= STOP_S + MARGIN_S
        # A drain, not a forced exit: the attempts held open were abandoned at the drain deadline.
        assert svc.proc is not None and svc.proc.returncode == 0, svc.log_text()[-1500:]
        # The runner's own drain deadline, or (a loaded machine) the service's at 0.7 T: either way a
        # drain that gave up on the held attempts, not the watchdog.
        log_text = svc.log_text()
        assert "attempts still in flight" in log_text or "dispatch did not stop in time" in log_text
        assert "did not stop within" not in log_text
    finally:
        svc.stop()


def test_serve_stops_in_time_with_a_blocked_internal_callable(sink, tmp_path) -> None:
    db = f"sqlite:///{tmp_path}/fl.db"
    tenant_id, token = new_tenant(db, "embedder")
    (tmp_path / "blocking_target.py").write_text(textwrap.dedent("""
        import os
        import threading

        from fireledger.dispatch.internal import register

        _never = threading.Event()

        def block(call):
            _never.wait()   # a callable that never returns: its thread is never given back

        register("test.block", block, tenants={os.environ["BLOCKING_TENANT"]})
    """))
    env = {STOP_TIMEOUT_ENV: str(STOP_S), "FIRELEDGER_INTERNAL_MODULES": "blocking_target",
           "BLOCKING_TENANT": tenant_id,
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)}
    svc = Service(db, tmp_path, env=env).start()
    try:
        api = Api(svc.base, token)
        tg = api.ok("POST", "/v1/targets", {"kind": "internal", "name": "test.block"}, 201)
        trig = api.ok("POST", "/v1/triggers", {"name": "blocker", "schedule": {"every": "1s"},
                                               "target_id": tg["id"], "timeout": "1s"}, 201)["id"]

        def timed_out_calls() -> int:
            items = api.ok("GET", f"/v1/triggers/{trig}/fires?limit=100")["items"]
            return sum(1 for f in items for a in f["attempts"] if a["result"] == "unknown")

        wait_until(lambda: timed_out_calls() >= 2, 30, "calls that outlived their timeout (threads held)")
        took = sigterm_and_time_exit(svc)
        assert took <= STOP_S + MARGIN_S
        # A thread that never returns cannot be joined: the watchdog ends the process, and says so.
        assert svc.proc is not None and svc.proc.returncode == FORCED_EXIT_STATUS, svc.log_text()[-1500:]
        assert "did not stop within" in svc.log_text()
    finally:
        svc.stop()


def test_the_attempt_runner_returns_in_time_while_its_store_is_locked(tmp_path) -> None:
    """A stuck settlement (and a stuck claim): another connection holds SQLite's write lock, so the
    runner's store thread waits in the busy handler. ``stop()`` must not wait for it."""
    from fireledger.clock import SystemClock
    from fireledger.dispatch.runner import Dispatcher
    from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
    from fireledger.store.sqlitelib import sqlite3
    from storekit import PlanesThread, add_target, add_tenant, add_trigger, open_store

    store = open_store("sqlite", tmp_path, None)
    sink = SinkServer(secrets=["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])
    base = sink.start_in_thread()
    locker = sqlite3.connect(str(tmp_path / "store.db"), isolation_level=None, timeout=1)
    planes = None
    try:
        clock = SystemClock(declared_eps_us=2_000)
        now = clock.now().latest_us
        t = add_tenant(store, now_us=now)
        tg = add_target(store, t, url=f"{base}/slow/1", secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", now_us=now)
        trig, _, _ = add_trigger(store, t, tg, {"every": "60s"}, now_us=now)
        fire = NewFire(t.id, trig.id, now, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING, now, "2026f", "t")
        row = store.registry.get_trigger(t.id, trig.id)
        store.timing.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), (fire,))])
        d = Dispatcher(store, clock, "d1", idle_s=0.05)
        d.drain_s = 2.0
        planes = PlanesThread([d]).start()
        wait_until(lambda: len(sink.records()) >= 1, 15, "the attempt to reach the target")
        locker.execute("BEGIN IMMEDIATE")   # the store is now stuck for the runner (busy timeout 30 s)
        wait_until(lambda: time.time() >= sink.records()[0]["arrived_at"] + 1.5, 5, "the answer and its recording",
                   interval_s=0.05)
        started = time.monotonic()
        stopped = planes.stop(d.drain_s + 3)
        took = time.monotonic() - started
        assert stopped, f"the attempt runner did not return within {d.drain_s + 3:g}s of stop()"
        assert took <= d.drain_s + 3
    finally:
        locker.close()   # releases the lock: the store thread finishes and the thread can end
        if planes is not None:
            planes.thread.join(40)
        # The runner returned without its store thread; let that call end before closing the store.
        wait_until(lambda: not any(th.name.startswith("dispatch-store") for th in threading.enumerate()), 40,
                   "the abandoned store call to end")
        sink.stop()
        store.close()
