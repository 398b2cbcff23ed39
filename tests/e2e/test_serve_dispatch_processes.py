"""``FIRELEDGER_DISPATCH_PROCESSES``: ``serve`` dispatches from extra child processes (by default
``min(usable cores, 2)`` processes in all, decision 0239), supervised and stopped with it, and ended when
it dies, ``kill -9`` included (decision 0240); a bad value stops ``serve`` before anything starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from e2e import Api, Service, new_tenant, verify_target, wait_until
from fireledger.cores import default_dispatch_processes, usable_cores
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


def dispatchers_of(pid: int) -> list[int]:
    """The extra dispatch processes ``serve`` ``pid`` runs now."""
    out = []
    for p in children_of(pid):
        try:
            if b"dispatch" in Path(f"/proc/{p}/cmdline").read_bytes():
                out.append(p)
        except OSError:
            continue   # ended meanwhile
    return out


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie — ended, not yet reaped — does not)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def test_the_setting_is_a_whole_number_from_1_to_64():
    assert dispatch_processes({}) == min(len(os.sched_getaffinity(0)), 2) == default_dispatch_processes()
    assert dispatch_processes({"FIRELEDGER_DISPATCH_PROCESSES": ""}) == default_dispatch_processes()
    assert dispatch_processes({"FIRELEDGER_DISPATCH_PROCESSES": "1"}) == 1   # a value set wins over the default
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


def test_the_default_is_one_process_on_one_usable_core_and_two_on_more():
    """The default follows the cores this process may use (its affinity), capped at 2."""
    probe = textwrap.dedent("""
        import os, sys
        from fireledger.cores import usable_cores
        from fireledger.settings import Settings
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        one = (usable_cores(), Settings.from_env({}).dispatch_processes,
               Settings.from_env({"FIRELEDGER_DISPATCH_PROCESSES": "2"}).dispatch_processes)
        print(*one)
    """)
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert r.stdout.split() == ["1", "1", "2"]   # one core: 1 by default; a value set still wins
    if usable_cores() >= 2:
        assert default_dispatch_processes() == 2


@pytest.mark.skipif(usable_cores() < 2, reason="the default is one process on one core")
def test_serve_by_default_dispatches_from_a_second_process_and_leaves_none_behind_on_stop(tmp_path):
    svc = Service(f"sqlite:///{tmp_path}/fl.db", tmp_path)
    svc.env.pop("FIRELEDGER_DISPATCH_PROCESSES", None)   # the default, whatever the run's environment sets
    svc.start()
    assert svc.proc is not None
    child: list[int] = []
    try:
        child = wait_until(lambda: dispatchers_of(svc.proc.pid), 30, "the extra dispatch process")
        assert len(child) == 1
    finally:
        assert svc.proc.poll() is None
        svc.proc.send_signal(signal.SIGTERM)   # to serve alone, as `kill PID` does: serve stops its child
        svc.proc.wait(timeout=20)
        svc.stop()
    assert svc.proc.returncode == 0, svc.log_text()[-2000:]
    assert not any(alive(p) for p in child), "the extra dispatch process outlived serve's stop"


def test_a_kill_9_of_serve_ends_its_extra_dispatch_process(tmp_path):
    """serve dies without stopping its child (SIGKILL to serve alone, not its process group): the child
    gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and ends; no orphan dispatcher goes on delivering."""
    svc = Service(f"sqlite:///{tmp_path}/fl.db", tmp_path, env={"FIRELEDGER_DISPATCH_PROCESSES": "2"}).start()
    assert svc.proc is not None
    child: list[int] = []
    try:
        child = wait_until(lambda: dispatchers_of(svc.proc.pid), 30, "the extra dispatch process")
        os.kill(svc.proc.pid, signal.SIGKILL)
        svc.proc.wait(timeout=20)
        wait_until(lambda: not any(alive(p) for p in child), 30, "the orphaned dispatch process to end")
    finally:
        svc.stop()
        for p in child:   # never leave one behind, even when the test fails
            if alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("prctl", [True, False], ids=["pdeathsig", "polling"])
def test_end_with_parent_ends_a_process_whose_parent_is_killed(tmp_path, prctl):
    """Both mechanisms of :func:`fireledger.children.end_with_parent` with a real ``kill -9`` of the parent:
    the kernel's parent-death signal (Linux) and the fallback that polls ``getppid()``."""
    pidfile = tmp_path / "grandchild.pid"
    grandchild = textwrap.dedent(f"""
        import os, signal, sys, time
        from fireledger.children import end_with_parent
        end_with_parent(int(sys.argv[1]), 0.05, prctl={prctl})
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        while True:
            time.sleep(1)   # ended only by the SIGTERM end_with_parent arranged
    """)
    parent = textwrap.dedent(f"""
        import os, subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", {grandchild!r}, str(os.getpid())])
        while True:
            time.sleep(1)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    try:
        pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), 30, "the grandchild to arm"))
        assert alive(pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
        wait_until(lambda: not alive(pid), 30, "the orphan to end")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


def test_a_child_whose_parent_is_already_gone_stops_at_once():
    r = subprocess.run([sys.executable, "-c", "from fireledger.children import end_with_parent; end_with_parent(1)"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "parent process 1 has ended" in r.stderr
