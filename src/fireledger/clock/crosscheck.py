"""Cross-checking the local clock against the store's clock (PostgreSQL: the cluster's authority).

Every ``interval_s`` the node reads ``clock_timestamp()`` between two local reads: offset = server −
midpoint, round trip = t2 − t1. The interval handed to the timing plane is the *union* of the local
interval and the server-corrected one (``local + offset ± rtt/2``), so the node is never early by
either clock; a node whose offset or round trip jumps widens its ε past the ceiling and sheds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .base import Clock, Interval

log = logging.getLogger("fireledger.clock")


@dataclass(frozen=True, slots=True)
class Probe:
    offset_us: int
    rtt_us: int
    at_mono: float


class CrossCheckedClock:
    """Wraps a base clock with a periodically measured server offset."""

    def __init__(self, base: Clock, server_time_us: Callable[[], int], *, interval_s: float = 5.0,
                 stale_s: float = 30.0) -> None:
        self.base = base
        self.server_time_us = server_time_us
        self.interval_s = interval_s
        self.stale_s = stale_s
        self.probe: Probe | None = None
        self._lock = threading.Lock()
        self._measuring = False   # a background measurement is in flight (at most one at a time)
        self.measure()

    def measure(self) -> Probe | None:
        """One measurement (thread-safe); returns None when the server could not be read."""
        try:
            t1 = time.time_ns() // 1000
            server = self.server_time_us()
            t2 = time.time_ns() // 1000
        except Exception as exc:  # the store is down: keep the last probe until it goes stale
            log.warning("clock cross-check failed: %s", exc)
            return None
        probe = Probe(server - (t1 + t2) // 2, t2 - t1, time.monotonic())
        with self._lock:
            self.probe = probe
        return probe

    def now(self) -> Interval:
        local = self.base.now()
        with self._lock:
            probe = self.probe
        mono = time.monotonic()
        if probe is None or mono - probe.at_mono > self.stale_s:
            # No recent word from the authority: an honest interval is unbounded for claiming.
            return Interval(local.earliest_us - 10**9, local.latest_us + 10**9, "postgres-stale")
        if mono - probe.at_mono > self.interval_s:
            self._measure_in_background()
        mid = (local.earliest_us + local.latest_us) // 2 + probe.offset_us
        half = probe.rtt_us // 2 + 1
        return Interval(min(local.earliest_us, mid - half), max(local.latest_us, mid + half),
                        f"{local.source}+postgres")

    def _measure_in_background(self) -> None:
        """Start one measuring thread unless one is in flight: every reading between a probe going
        old and the next one landing asks for a measurement, and over a slow link (the round trip is
        what is measured) that is many readings."""
        with self._lock:
            if self._measuring:
                return
            self._measuring = True

        def run() -> None:
            try:
                self.measure()
            finally:
                with self._lock:
                    self._measuring = False

        threading.Thread(target=run, name="clock-cross-check", daemon=True).start()

    def monotonic(self) -> float:
        return self.base.monotonic()
