"""The service's timed-wait signal (decisions 0237, 0245): the ``threading.Event`` contract, and a timed
wait that returns under libfaketime, where ``threading.Event.wait(timeout)`` does not."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from falsify.timing_cluster import libfaketime

from fireledger.waker import Waker

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
from fireledger.waker import Waker
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


NODE_SCRIPT = """
import sys, time
from fireledger.clock import SystemClock
from fireledger.store import Store
from fireledger.timing.node import TimingNode
assert time.gmtime().tm_year == 2027, time.gmtime()   # the clock is faked
store = Store.open("sqlite:///" + sys.argv[1])
node = TimingNode.build(store, SystemClock(), "n-faked", leases=False, shadow=False, listen=False)
assert node.session is not None
node.session.interval_s = 0.05
node._start("session", node.session.run)
deadline = time.perf_counter() + 5.0
while node.session.beats < 4 and time.perf_counter() < deadline:
    time.sleep(0.01)
node._stop.set()
print(node.session.beats)
"""


def test_the_timing_nodes_threads_keep_their_period_under_libfaketime(tmp_path):
    """The node's threads (leases, shadow, session heartbeat) sleep on the node's stop signal. With
    a ``threading.Event`` there the session beats once and then sleeps until real time reaches the
    fake one (decision 0245): ``beats`` stays at 1 and the test fails."""
    env = {**os.environ, "LD_PRELOAD": libfaketime(), "FAKETIME": "@2027-03-28 00:59:40 x1",
           "FAKETIME_DONT_RESET": "1", "FAKETIME_NO_CACHE": "1", "TZ": "UTC",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", NODE_SCRIPT, str(tmp_path / "store.db")], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip().splitlines()[-1]) >= 4


#: ``threading.Event`` objects the package may hold: none of them is waited on with a timeout.
EVENTS_NEVER_WAITED_WITH_A_TIMEOUT = {
    "stopping.py": "StopGuard._armed: only set and tested",
    "store/listen.py": "ChannelListener.listening: only set, cleared and read (tests wait on it unfaked)",
}


def test_every_thread_that_sleeps_with_a_timeout_sleeps_on_a_waker():
    """A ``threading.Event`` waited on with a timeout never wakes under a clock faked ahead (decision
    0245); the package holds only the events listed above, each never waited on with a timeout."""
    pkg = ROOT / "src" / "fireledger"
    found = {str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if "threading.Event(" in p.read_text()}
    assert found == set(EVENTS_NEVER_WAITED_WITH_A_TIMEOUT)


def test_several_threads_wait_at_once_and_one_set_ends_every_wait():
    """A timing node's threads share its stop signal: concurrent waits must not fail (a shared
    ``select.poll`` object raises "concurrent poll() invocation" in the second waiter)."""
    w = Waker()
    timed_out: list[bool] = []
    ended: list[bool] = []
    errors: list[BaseException] = []
    start = threading.Barrier(5)

    def waiter() -> None:
        try:
            start.wait()
            timed_out.append(w.wait(0.3))   # four waits that overlap for 0.3 s
            start.wait()
            ended.append(w.wait(30))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for t in threads:
        t.start()
    start.wait(timeout=10)
    start.wait(timeout=10)
    w.set()
    for t in threads:
        t.join(timeout=10)
    assert errors == []
    assert timed_out == [False] * 4 and ended == [True] * 4
