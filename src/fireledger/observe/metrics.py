"""Prometheus metrics for the planes (served at ``/metrics`` by the control plane).

One registry per process. The paging signal is ``fireledger_oldest_undispatched_due_age_seconds``:
how long the oldest instant that should have been decided or delivered has been waiting. It is
computed from the store at scrape time, so a stalled timing plane shows up even when every process
is healthy.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.eps = Gauge("fireledger_clock_eps_seconds", "Clock uncertainty ε of this node",
                         ["node", "source"], registry=r)
        self.shedding = Gauge("fireledger_timing_shedding", "1 while this node claims nothing (ε over the ceiling)",
                              ["node"], registry=r)
        self.fires = Counter("fireledger_fires_total", "Fire records committed", ["lane", "state"], registry=r)
        self.lateness = Histogram("fireledger_decision_lateness_seconds",
                                  "Decided instant minus scheduled instant, per on-time fire",
                                  buckets=LATENESS_BUCKETS, registry=r)
        self.attempts = Counter("fireledger_attempts_total", "Dispatch attempts by result", ["lane", "result"],
                                registry=r)
        self.delivery_lateness = Histogram("fireledger_delivery_lateness_seconds",
                                           "Attempt end minus scheduled instant, per delivered fire",
                                           buckets=LATENESS_BUCKETS, registry=r)

    def add_due_age(self, compute: Callable[[], float | None]) -> None:
        """Register the paging signal, computed at scrape time by ``compute`` (seconds or None)."""

        class _DueAge:
            def collect(self):  # type: ignore[no-untyped-def]
                g = GaugeMetricFamily("fireledger_oldest_undispatched_due_age_seconds",
                                      "Age of the oldest due instant not yet decided or delivered")
                age = compute()
                g.add_metric([], 0.0 if age is None else max(0.0, age))
                yield g

        self.registry.register(_DueAge())

    def render(self) -> bytes:
        return generate_latest(self.registry)


METRICS = Metrics()
