"""The adaptive per-origin connection limit (``fireledger.dispatch.limiter``), pure: driven by the
outcomes and response times a fake clock measures, no I/O."""

from __future__ import annotations

import pytest

from fireledger.clock import FakeClock
from fireledger.dispatch.limiter import AdaptiveLimit

S = 1_000_000


class Receiver:
    """A receiver model on a fake clock: answers within ``service_s`` while at most ``capacity``
    requests are open, and drops what is beyond it (an accept queue that is full)."""

    def __init__(self, capacity: int, service_s: float) -> None:
        self.capacity = capacity
        self.service_s = service_s
        self.clock = FakeClock(1_700_000_000 * S)

    def round(self, lim: AdaptiveLimit) -> tuple[int, int]:
        """One round trip at the limit: every allowed request sent at once; returns (ok, dropped)."""
        n = lim.allowed
        epoch = lim.epoch
        start = self.clock.now().latest_us
        self.clock.advance(int(self.service_s * S))
        latency = (self.clock.now().latest_us - start) / S
        ok = min(n, self.capacity)
        for _ in range(ok):
            lim.on_success(latency, n)
        for _ in range(n - ok):
            lim.on_drop(epoch)
        return ok, n - ok


def test_starts_small_and_never_above_the_configured_maximum() -> None:
    assert AdaptiveLimit(maximum=64).allowed == 4
    assert AdaptiveLimit(maximum=2).allowed == 2
    lim = AdaptiveLimit(maximum=64)
    rx = Receiver(capacity=1000, service_s=0.01)
    for _ in range(50):
        rx.round(lim)
    assert lim.allowed == 64 and lim.decreases == 0


def test_slow_start_doubles_per_round_trip_while_the_receiver_keeps_up() -> None:
    lim = AdaptiveLimit(maximum=1000)
    rx = Receiver(capacity=1000, service_s=0.01)
    seen = []
    for _ in range(4):
        rx.round(lim)
        seen.append(lim.allowed)
    assert seen == [8, 16, 32, 64]


def test_one_congestion_halves_once_however_many_requests_report_it() -> None:
    lim = AdaptiveLimit(maximum=64, initial=32)
    for _ in range(20):
        lim.on_drop(0)   # twenty requests of the same round (epoch 0) report the same congestion
    assert lim.allowed == 16 and lim.decreases == 1
    assert lim.on_drop(lim.epoch) and lim.allowed == 8   # a request started after the decrease: again


def test_the_limit_settles_near_what_the_receiver_can_take() -> None:
    lim = AdaptiveLimit(maximum=64)
    rx = Receiver(capacity=6, service_s=0.01)   # the standard library server's backlog of 5, plus one
    dropped = 0
    history = []
    for _ in range(200):
        _, d = rx.round(lim)
        dropped += d
        history.append(lim.allowed)
    assert lim.decreases >= 1
    assert max(history[50:]) <= 7 and min(history[50:]) >= 3   # around the capacity, never at 1 for good
    assert dropped < 200   # a drop now and then (probing), not one per request


def test_a_slow_receiver_that_keeps_up_lets_the_limit_grow() -> None:
    lim = AdaptiveLimit(maximum=64)
    rx = Receiver(capacity=1000, service_s=0.5)   # always half a second, whatever the load
    for _ in range(6):
        rx.round(lim)
    assert lim.allowed == 64 and lim.decreases == 0


def test_response_times_that_grow_with_the_load_hold_the_limit() -> None:
    lim = AdaptiveLimit(maximum=64)
    lim.on_success(0.01, 4)              # baseline: 10 ms
    before = lim.limit
    for _ in range(10):
        lim.on_success(0.5, 4)           # queueing at the receiver: fifty times the baseline
    assert lim.limit == before
    lim.on_success(0.012, 5)             # within the expected time again: grows
    assert lim.limit > before


def test_growth_only_when_the_limit_was_what_held_requests_back() -> None:
    lim = AdaptiveLimit(maximum=64)
    for _ in range(10):
        lim.on_success(0.01, 1)          # one request at a time: the limit was never reached
    assert lim.allowed == 4


def test_never_below_the_minimum() -> None:
    lim = AdaptiveLimit(maximum=64, initial=2)
    for _ in range(10):
        lim.on_drop(lim.epoch)
    assert lim.allowed == 1 and lim.limit == 1


@pytest.mark.parametrize(("minimum", "maximum"), [(0, 4), (5, 4)])
def test_bad_bounds_are_refused(minimum: int, maximum: int) -> None:
    with pytest.raises(ValueError):
        AdaptiveLimit(maximum=maximum, minimum=minimum)
