"""``FIRELEDGER_DISPATCH_PROCESSES``: ``serve`` dispatches from extra child processes, supervised and
stopped with it; a bad value stops ``serve`` before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from e2e import Api, Service, new_tenant, verify_target, wait_until
from fireledger.service import dispatch_processes
from sink import SinkServer


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def test_the_setting_is_a_whole_number_from_1_to_64():
    assert dispatch_processes({}) == 1
    assert dispatch_processes({"FIRELEDGER_DISPATCH_PROCESSES": "3"}) == 3
    for bad in ("0", "65", "two", "-1", "1.5"):
        with pytest.raises(ValueError, match="FIRELEDGER_DISPATCH_PROCESSES"):
            dispatch_processes({"FIRELEDGER_DISPATCH_PROCESSES": bad})


def test_a_bad_value_stops_serve_with_one_line(tmp_path):
    env = {**os.environ, "FIRELEDGER_DISPATCH_PROCESSES": "zero"}   # the run's state directory (conftest)
    r = subprocess.run([sys.executable, "-c", "from fireledger.cli import main; main()", "serve", "--db",
                        f"sqlite:///{tmp_path}/fl.db", "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2
    assert "FIRELEDGER_DISPATCH_PROCESSES" in r.stderr and "Traceback" not in r.stderr


def test_serve_with_two_dispatch_processes_delivers_each_fire_once_and_stops_its_child(tmp_path):
    db = f"sqlite:///{tmp_path}/fl.db"
    sink = SinkServer()
    sink.start_in_thread()
    svc = Service(db, tmp_path, env={"FIRELEDGER_DISPATCH_PROCESSES": "2"}).start()
    try:
        assert svc.proc is not None
        child = wait_until(lambda: [p for p in children_of(svc.proc.pid)
                                    if b"dispatch" in Path(f"/proc/{p}/cmdline").read_bytes()],
                           20, "the extra dispatch process")
        _, token = new_tenant(db)
        api = Api(svc.base, token)
        tg = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/ok"}, 201)
        sink.add_secret(tg["secret"])
        verify_target(api, sink, tg)
        ids = [api.ok("POST", "/v1/triggers", {"name": f"t{i}", "schedule": {"every": "1s"},
                                              "target_id": tg["id"], "jitter": "0s"}, 201)["id"] for i in range(20)]

        def delivered():
            keys = [r["fire_key"] for r in sink.records()]
            return keys if len(set(keys)) >= 60 else None

        keys = wait_until(delivered, 30, "60 deliveries")
        assert len(keys) == len(set(keys)), "a fire was delivered twice"
        for tid in ids[:3]:
            fires = api.ok("GET", f"/v1/triggers/{tid}/fires?limit=1000")["items"]
            assert all(len(f["attempts"]) <= 1 for f in fires)
    finally:
        svc.stop()
        sink.stop()
    assert all(not Path(f"/proc/{p}").exists() or b"zombie" in Path(f"/proc/{p}/status").read_bytes().lower()
               for p in child), "the extra dispatch process outlived serve"
