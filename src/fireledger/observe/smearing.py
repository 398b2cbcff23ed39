"""The avoided-peak report for jitter smearing (seed ADR-10: "the peak capacity avoided by smearing is
reported, so the trade is visible rather than assumed").

Over a window of scheduled instants, for the *on-time scheduled* fires recorded in the ledger (the
fires smearing applies to; withheld ones left out):

* **peak without smearing** — the largest number of fires whose *scheduled instant* falls in one
  second: what the dispatch plane would have had to start in that second had every fire been
  dispatched at its instant;
* **peak with smearing** — the largest number whose *dispatch not-before instant* falls in one
  second. That instant is recomputed with the timing plane's own function
  (:func:`fireledger.domain.smearing.dispatch_not_before_us`) from the trigger id, the instant and
  the fire's (immutable) version's jitter window — exactly what the planner applied (decision 0067);
* **avoided peak** = without − with (fires per second), ``avoided_ratio`` = avoided / without, and
  ``peak_ratio`` = without / with;
* **peak dispatched** — the largest number of *first attempts* started in one second, measured
  (``dispatched_at``): the smear as it happened, including the decision delay and lane shaping;
* **capped fires** — smeared fires whose trigger's next instant is closer than twice the window:
  their offset is kept below half that gap, so smearing never reorders a trigger's own fires
  (decision 0145). The recomputation takes the next instant from the version's own schedule;
* **lateness of smeared fires**, raw (dispatched − scheduled) beside *net of the declared smear*
  (dispatched − dispatch not-before): p50, p99 and max in seconds. The raw figure is what the
  tenant sees; the net one is what the service added on top of the smear it declared.

Seconds are UTC epoch seconds (``floor(µs / 10⁶)``). The whole store (every tenant) or one tenant.
:class:`SmearingCollector` exports the last 15 minutes as Prometheus gauges, recomputed at most once
a minute (reads the ledger by tenant over its tenant/instant index; off the fire path).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fireledger.definitions import next_us, recurrence_of
from fireledger.domain.keys import from_us
from fireledger.domain.smearing import dispatch_not_before_us, is_capped, is_popular
from fireledger.recurrence import Recurrence, RecurrenceError, format_instant

log = logging.getLogger("fireledger.observe")

US = 1_000_000
PAGE = 5000
#: The gauges' window and how long one computation is reused.
GAUGE_WINDOW_US = 15 * 60 * US
GAUGE_TTL_S = 60.0


@dataclass(frozen=True, slots=True)
class Peak:
    per_s: int
    second_us: int | None   # the start of the (first) peak second; None when there is no fire

    def as_json(self) -> dict[str, Any]:
        return {"per_s": self.per_s,
                "at": None if self.second_us is None else format_instant(from_us(self.second_us))}


@dataclass(frozen=True, slots=True)
class SmearingReport:
    from_us: int
    to_us: int
    fires: int                 # on-time scheduled fires in the window
    popular_fires: int         # of which on a whole-minute instant
    smeared_fires: int         # of which with a jitter window > 0 (delayed by smearing)
    opted_out_fires: int       # on a whole minute, jitter 0s
    dispatched_fires: int
    without: Peak
    with_: Peak
    dispatched: Peak
    capped_fires: int = 0      # smeared fires whose offset the trigger's next instant capped
    lateness_raw: dict[str, float | None] | None = None   # smeared and dispatched: p50/p99/max, s
    lateness_net: dict[str, float | None] | None = None   # the same, net of the declared smear

    @property
    def avoided_peak_per_s(self) -> int:
        return max(0, self.without.per_s - self.with_.per_s)

    @property
    def avoided_ratio(self) -> float | None:
        return None if not self.without.per_s else round(self.avoided_peak_per_s / self.without.per_s, 4)

    @property
    def peak_ratio(self) -> float | None:
        return None if not self.with_.per_s else round(self.without.per_s / self.with_.per_s, 3)

    def as_json(self) -> dict[str, Any]:
        return {
            "from": format_instant(from_us(self.from_us)), "to": format_instant(from_us(self.to_us)),
            "fires": self.fires, "popular_fires": self.popular_fires, "smeared_fires": self.smeared_fires,
            "opted_out_fires": self.opted_out_fires, "dispatched_fires": self.dispatched_fires,
            "peak_without_smearing": self.without.as_json(), "peak_with_smearing": self.with_.as_json(),
            "peak_dispatched": self.dispatched.as_json(),
            "avoided_peak_per_s": self.avoided_peak_per_s, "avoided_ratio": self.avoided_ratio,
            "peak_ratio": self.peak_ratio,
            "capped_fires": self.capped_fires,
            "smear_cap": "a smeared fire's offset stays below half the gap to its trigger's next instant, "
                         "so smearing never reorders a trigger's own fires",
            "smeared_lateness_s": {"raw": self.lateness_raw or _summary([]),
                                   "net_of_smear": self.lateness_net or _summary([])},
        }


def _summary(values_us: list[int]) -> dict[str, float | None]:
    """p50 / p99 / max of µs values, in seconds (nearest rank); None for each when empty."""
    if not values_us:
        return {"fires": 0, "p50": None, "p99": None, "max": None}
    v = sorted(values_us)

    def rank(q: float) -> float:
        return v[max(0, math.ceil(q * len(v)) - 1)] / US

    return {"fires": len(v), "p50": rank(0.5), "p99": rank(0.99), "max": v[-1] / US}


def _peak(counts: Counter[int]) -> Peak:
    if not counts:
        return Peak(0, None)
    second, n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return Peak(n, second * US)


class _Tally:
    def __init__(self) -> None:
        self.without: Counter[int] = Counter()
        self.with_: Counter[int] = Counter()
        self.dispatched: Counter[int] = Counter()
        self.fires = self.popular = self.smeared = self.opted_out = self.n_dispatched = self.capped = 0
        self.raw: list[int] = []
        self.net: list[int] = []

    def add(self, trigger_id: str, scheduled_us: int, dispatched_us: int | None, jitter_s: int,
            next_us: int | None = None) -> None:
        """Count one on-time scheduled fire; ``next_us`` is its trigger's next instant (the cap)."""
        self.fires += 1
        self.without[scheduled_us // US] += 1
        nb = dispatch_not_before_us(trigger_id, scheduled_us, jitter_s, next_us)
        self.with_[(scheduled_us if nb is None else nb) // US] += 1
        if is_popular(scheduled_us):
            self.popular += 1
            if jitter_s > 0:
                self.smeared += 1
                self.capped += is_capped(scheduled_us, jitter_s, next_us)
            else:
                self.opted_out += 1
        if dispatched_us is not None:
            self.n_dispatched += 1
            self.dispatched[dispatched_us // US] += 1
            if nb is not None:
                self.raw.append(max(0, dispatched_us - scheduled_us))
                self.net.append(max(0, dispatched_us - nb))


class _Versions:
    """Per (trigger, version): the jitter window and the compiled schedule, read once."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.jitter: dict[tuple[str, int], int] = {}
        self.recs: dict[tuple[str, int], Recurrence | None] = {}

    def jitter_s(self, trigger_id: str, version: int) -> int:
        key = (trigger_id, version)
        j = self.jitter.get(key)
        if j is None:
            j = self.jitter[key] = self.store.registry.version_jitter_s(trigger_id, version)
        return j

    def next_instant(self, trigger_id: str, version: int, scheduled_us: int) -> int | None:
        key = (trigger_id, version)
        if key not in self.recs:
            v = self.store.registry.get_version(trigger_id, version)
            try:
                self.recs[key] = None if v is None else recurrence_of(v)
            except RecurrenceError:
                self.recs[key] = None
        rec = self.recs[key]
        if rec is None:
            return None
        try:
            return next_us(rec, scheduled_us)
        except RecurrenceError:
            return None


def smearing_report(store: Any, from_us: int, to_us: int, tenant_ids: Iterable[str] | None = None) -> SmearingReport:
    """The report over scheduled instants in ``[from_us, to_us)`` for ``tenant_ids`` (default: every
    tenant of the store). Read only; pages through the ledger ``PAGE`` rows at a time."""
    tally = _Tally()
    versions = _Versions(store)
    for tenant_id in (store.history.tenant_ids() if tenant_ids is None else tenant_ids):
        after: tuple[int, str, int] | None = None
        while True:
            rows = store.history.smear_rows(tenant_id, from_us, to_us, after=after, limit=PAGE)
            for trigger_id, version, scheduled_us, _seq, dispatched_us in rows:
                j = versions.jitter_s(trigger_id, version)
                nxt = (versions.next_instant(trigger_id, version, scheduled_us)
                       if j > 0 and is_popular(scheduled_us) else None)
                tally.add(trigger_id, scheduled_us, dispatched_us, j, nxt)
            if len(rows) < PAGE:
                break
            last = rows[-1]
            after = (last[2], last[0], last[3])
    return SmearingReport(from_us, to_us, tally.fires, tally.popular, tally.smeared, tally.opted_out,
                          tally.n_dispatched, _peak(tally.without), _peak(tally.with_), _peak(tally.dispatched),
                          tally.capped, _summary(tally.raw), _summary(tally.net))


class SmearingCollector:
    """Prometheus gauges of the smearing report over the last 15 minutes (every tenant), recomputed
    at most once a minute; a store that cannot be read leaves them out of that scrape."""

    def __init__(self, store: Any, clock: Any, *, window_us: int = GAUGE_WINDOW_US, ttl_s: float = GAUGE_TTL_S) -> None:
        self.store = store
        self.clock = clock
        self.window_us = window_us
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cached: tuple[float, SmearingReport] | None = None

    def describe(self) -> list[Any]:
        return []   # computed at scrape time

    def report(self) -> SmearingReport:
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < self.ttl_s:
                return self._cached[1]
            hi = self.clock.now().earliest_us
            rep = smearing_report(self.store, hi - self.window_us, hi)
            self._cached = (now, rep)
            return rep

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            rep = self.report()
        except Exception as exc:   # the scrape answers even when the store does not
            log.warning("metrics: the smearing report could not be computed: %s", type(exc).__name__)
            return
        peak = GaugeMetricFamily("fireledger_smearing_peak_fires_per_second",
                                 "Largest number of on-time scheduled fires in one second over the last 15 min: "
                                 "by scheduled instant (unsmeared), by dispatch not-before (smeared), by first "
                                 "dispatch (dispatched)", labels=["schedule"])
        peak.add_metric(["unsmeared"], float(rep.without.per_s))
        peak.add_metric(["smeared"], float(rep.with_.per_s))
        peak.add_metric(["dispatched"], float(rep.dispatched.per_s))
        yield peak
        yield GaugeMetricFamily("fireledger_smearing_avoided_peak_fires_per_second",
                                "Peak dispatch capacity avoided by jitter smearing over the last 15 min "
                                "(unsmeared peak minus smeared peak, fires/s)", value=float(rep.avoided_peak_per_s))


__all__ = ["Peak", "SmearingCollector", "SmearingReport", "smearing_report"]
