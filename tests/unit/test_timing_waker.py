"""The timing thread's wake-up signal (decision 0237): the ``threading.Event`` contract, and a timed
wait that returns under libfaketime, where ``threading.Event.wait(timeout)`` does not."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from falsify.timing_cluster import libfaketime

from fireledger.timing.waker import Waker

ROOT = Path(__file__).resolve().parents[2]


def test_a_timed_wait_without_a_set_returns_false_after_its_timeout_not_before():
    w = Waker()
    t0 = time.monotonic()
    assert w.wait(0.05) is False
    assert time.monotonic() - t0 >= 0.05


def test_a_set_before_the_wait_returns_at_once_and_stays_set_until_cleared():
    w = Waker()
    w.set()
    w.set()   # several sets: still one signal, never blocking
    assert w.is_set() and w.wait(10) is True and w.wait(10) is True
    w.clear()
    assert not w.is_set() and w.wait(0) is False


def test_a_set_from_another_thread_ends_a_long_wait():
    w = Waker()
    threading.Timer(0.05, w.set).start()
    t0 = time.monotonic()
    assert w.wait(30) is True
    assert time.monotonic() - t0 < 10


def test_a_byte_left_by_a_cancelled_set_does_not_end_the_wait_early():
    w = Waker()
    w.set()
    w._flag = False   # a clear() that raced with the set: the flag went, its byte stayed
    t0 = time.monotonic()
    assert w.wait(0.05) is False
    assert time.monotonic() - t0 >= 0.05


SCRIPT = """
import sys, time
from fireledger.timing.waker import Waker
assert time.gmtime().tm_year == 2027, time.gmtime()   # the clock is faked
w = Waker()
t0 = time.perf_counter()
assert w.wait(0.2) is False
print(round(time.perf_counter() - t0, 3))
"""


def test_a_timed_wait_returns_under_libfaketime():
    """With ``threading.Event`` in place of the Waker this process sleeps until real time reaches the
    fake one (a year): the run below is cut at 20 s and the test fails."""
    env = {**os.environ, "LD_PRELOAD": libfaketime(), "FAKETIME": "@2027-03-28 00:59:40 x1",
           "FAKETIME_DONT_RESET": "1", "FAKETIME_NO_CACHE": "1", "TZ": "UTC",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=20,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 0.2 <= float(out.stdout.strip()) < 10
