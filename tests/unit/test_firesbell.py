"""``store/firesbell.py`` (decision 0256): the SQLite engine's wake-up between processes. Real files
and a real watcher thread; waits poll with a deadline."""

from __future__ import annotations

import os
import stat
import threading
import time

from fireledger.store.firesbell import SUFFIX, FiresBell, bell_path_for


def _wait(cond, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_no_bell_for_a_database_without_a_file_of_its_own():
    for path in ("", ":memory:", "file:x?mode=memory"):
        assert bell_path_for(path) is None
        assert FiresBell(path).watch(lambda: None) is None
        FiresBell(path).ring()   # a no-op, never an error


def test_a_ring_in_another_handle_wakes_the_watcher_once_per_change(tmp_path):
    db = str(tmp_path / "fl.db")
    ringer, watcher = FiresBell(db), FiresBell(db)   # as two processes: two descriptors
    calls: list[float] = []
    seen = threading.Event()

    def on_ring() -> None:
        calls.append(time.monotonic())
        seen.set()

    stop = watcher.watch(on_ring, poll_s=0.005)
    assert stop is not None
    try:
        path = db + SUFFIX
        assert os.path.exists(path) and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert not seen.wait(0.05)   # nothing rung: no call
        ringer.ring()
        assert _wait(lambda: len(calls) == 1)
        with open(path, "rb") as f:
            content = f.read()
        assert len(content) == 8   # random bytes only: nothing of a fire
        ringer.ring()
        ringer.ring()
        assert _wait(lambda: len(calls) >= 2)
        assert ringer.rung == 3
    finally:
        stop.set()
        ringer.close()
        watcher.close()


def test_a_failing_callback_does_not_end_the_watcher(tmp_path):
    db = str(tmp_path / "fl.db")
    bell = FiresBell(db)
    calls: list[int] = []

    def on_ring() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")

    stop = bell.watch(on_ring, poll_s=0.005)
    assert stop is not None
    try:
        bell.ring()
        assert _wait(lambda: len(calls) == 1)
        bell.ring()
        assert _wait(lambda: len(calls) == 2)
    finally:
        stop.set()
        bell.close()


def test_an_unwritable_directory_leaves_the_bell_quiet(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        bell = FiresBell(str(ro / "fl.db"))
        if os.geteuid() == 0:   # root writes anyway: the bell works, which is all this can show
            bell.ring()
            assert bell.rung == 1
        else:
            bell.ring()
            assert bell.path is None and bell.rung == 0
            assert bell.watch(lambda: None) is None
        bell.close()
    finally:
        ro.chmod(0o700)
