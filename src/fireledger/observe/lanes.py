"""Store-read metric families for lanes, the declared drain and the duplicate-delivery rate
(decisions 0165–0167), served by :class:`~fireledger.observe.metrics.StoreCollector`:

* ``fireledger_lane_due_age_seconds{lane}`` — per lane (on-time, catch-up, backfill; always
  present, 0 when nothing waits): how long the lane's oldest fire never attempted has been
  dispatchable. One index-ordered ``LIMIT 1`` per lane.
* ``fireledger_undecided_due_age_seconds`` — how long the earliest due-index row has been due
  without a decision (the timing plane's part of the page).
* ``fireledger_page_due_age_seconds`` — what the page looks at: the older of the two above for the
  on-time lane (catch-up and backfill never page).
* ``fireledger_drain_declared`` — 1 while an operator's declared drain is in force (the shipped page
  is suppressed), ``fireledger_drain_remaining_seconds`` — until it expires (0 without one).
* ``fireledger_duplicate_deliveries_per_million{kind}`` — over the fires scheduled in the trailing
  :data:`DUPLICATE_WINDOW_US` (every tenant): ``proven`` (a ``delivered`` attempt of an already
  delivered fire) and ``possible`` (an attempt after one whose answer the ledger never learned), per
  million delivered fires; ``fireledger_delivered_fires_window`` is the denominator. Read at most
  every :data:`DUPLICATE_TTL_S` (a window read costs more than a probe); absent until first read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from fireledger.domain.lane_records import DeliveryCounts, age_s, page_due_age_s

LANE_NAMES: tuple[str, ...] = ("on-time", "catch-up", "backfill")
LANE_DUE_AGE = "fireledger_lane_due_age_seconds"
PAGE_DUE_AGE = "fireledger_page_due_age_seconds"
DRAIN_DECLARED = "fireledger_drain_declared"
DUPLICATES = "fireledger_duplicate_deliveries_per_million"
#: The trailing window of scheduled instants the duplicate rate is computed over (1 h).
DUPLICATE_WINDOW_US = 3600 * 1_000_000
#: How long the duplicate rate's reading is reused (seconds).
DUPLICATE_TTL_S = 60.0


def lane_families(store: Any, now_us: int) -> Iterator[Metric]:
    """The lane, page and drain families at ``now_us`` (raises what the store raises)."""
    since = store.history.lane_due_since(LANE_NAMES)
    undecided = store.history.undecided_since()
    drain = store.dispatch.drain_in_force(now_us)
    lanes = GaugeMetricFamily(LANE_DUE_AGE, "Age of the oldest fire never attempted per lane, from its dispatch "
                              "time (0: none waiting)", labels=["lane"])
    for lane in LANE_NAMES:
        lanes.add_metric([lane], age_s(now_us, since.get(lane)))
    yield lanes
    yield GaugeMetricFamily("fireledger_undecided_due_age_seconds", "Age of the earliest due-index row not yet "
                            "decided (0: none due)", value=age_s(now_us, undecided))
    yield GaugeMetricFamily(PAGE_DUE_AGE, "The paging due age: undecided rows and the on-time lane "
                            "(catch-up and backfill never page)", value=page_due_age_s(now_us, undecided, since))
    yield GaugeMetricFamily(DRAIN_DECLARED, "1 while a declared drain is in force (the page is suppressed)",
                            value=1.0 if drain is not None else 0.0)
    yield GaugeMetricFamily("fireledger_drain_remaining_seconds", "Seconds until the declared drain expires "
                            "(0: none in force)", value=0.0 if drain is None else (drain.expires_us - now_us) / 1e6)


def cluster_delivery_counts(store: Any, lo_us: int, hi_us: int) -> DeliveryCounts:
    """Delivery counts of every tenant's fires scheduled in ``[lo_us, hi_us)``."""
    fires = dup = possible = 0
    for tenant_id in store.history.tenant_ids():
        c = store.history.delivery_counts(tenant_id, lo_us, hi_us)
        fires += c.delivered_fires
        dup += c.duplicate_attempts
        possible += c.possible_duplicate_attempts
    return DeliveryCounts(fires, dup, possible)


class DuplicateRate:
    """The duplicate-rate families, re-read from the store at most every ``ttl_s`` seconds of
    ``monotonic`` time (the last reading is served in between; a failed read keeps it)."""

    def __init__(self, *, ttl_s: float = DUPLICATE_TTL_S, window_us: int = DUPLICATE_WINDOW_US,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.window_us = window_us
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._counts: DeliveryCounts | None = None

    def families(self, store: Any, now_us: int) -> Iterator[Metric]:
        """The families (none before the first successful reading)."""
        with self._lock:
            t = self.monotonic()
            if self._read_at is None or t - self._read_at >= self.ttl_s:
                self._counts = cluster_delivery_counts(store, now_us - self.window_us, now_us)
                self._read_at = t
            counts = self._counts
        if counts is None:
            return
        rate = GaugeMetricFamily(DUPLICATES, "Extra delivery attempts per million delivered fires scheduled in the "
                                 "trailing hour, measured by the ledger: proven (a 2xx for an already delivered "
                                 "key) and possible (after an attempt whose answer was never learned)",
                                 labels=["kind"])
        rate.add_metric(["proven"], counts.duplicates_per_million or 0.0)
        rate.add_metric(["possible"], counts.possible_per_million or 0.0)
        yield rate
        yield GaugeMetricFamily("fireledger_delivered_fires_window", "Fires delivered among those scheduled in "
                                "the duplicate rate's trailing window", value=float(counts.delivered_fires))


__all__ = ["DRAIN_DECLARED", "DUPLICATES", "DUPLICATE_TTL_S", "DUPLICATE_WINDOW_US", "LANE_DUE_AGE", "LANE_NAMES",
           "PAGE_DUE_AGE", "DuplicateRate", "cluster_delivery_counts", "lane_families"]
