"""The timing loop holds the cyclic collector off for one batch only (decision 0136): it is enabled
again after the block — also when the block raises, also when blocks of several threads overlap —
and a collector the embedding application disabled stays disabled."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from fireledger.timing.plans import gc_paused


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_enabled_after_even_on_error() -> None:
    gc.enable()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a store failure")
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_blocks_in_two_threads_share_one_pause() -> None:
    gc.enable()
    inside, leave = threading.Event(), threading.Event()
    seen: list[bool] = []

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait(10)
        seen.append(gc.isenabled())

    t = threading.Thread(target=other)
    with gc_paused():
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()   # the other thread's block is still open
    leave.set()
    t.join(10)
    assert seen == [True] and gc.isenabled()
