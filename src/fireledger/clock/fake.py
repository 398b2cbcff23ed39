"""A fake clock for the pure policies and single-process logic: time moves only when told."""

from __future__ import annotations

import threading

from .base import Interval


class FakeClock:
    """True time ``true_us`` and a declared ε; ``now()`` returns ``[true-ε+skew, true+ε+skew]``.

    ``skew_us`` models a node whose clock is wrong *within* its declared bound (tests of
    invariant 3 set skew = +ε: the node reads late-side time and still must not fire early).
    """

    def __init__(self, true_us: int, eps_us: int = 0, skew_us: int = 0, source: str = "fake") -> None:
        self._lock = threading.Lock()
        self.true_us = true_us
        self.eps_us = eps_us
        self.skew_us = skew_us
        self.source = source
        self._mono = 0.0

    def now(self) -> Interval:
        with self._lock:
            centre = self.true_us + self.skew_us
            return Interval(centre - self.eps_us, centre + self.eps_us, self.source)

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, us: int) -> None:
        with self._lock:
            self.true_us += us
            self._mono += us / 1e6

    def set(self, true_us: int) -> None:
        with self._lock:
            self._mono += (true_us - self.true_us) / 1e6
            self.true_us = true_us
