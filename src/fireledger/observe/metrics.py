"""Prometheus metrics (served at ``/metrics`` by the control plane).

Two sources, one exposition:

* :data:`METRICS` — this process's own counters and gauges, fed by the planes running in it
  (fires committed by lane and state, decision and delivery lateness histograms, attempt results,
  ε and shedding of its timing loop).
* :class:`StoreCollector` — cluster-wide facts read from the store *at scrape time*, so they are true
  whichever process serves them and whichever processes are down:

  - ``fireledger_oldest_undispatched_due_age_seconds{partition}`` — the paging signal (seed ADR-13):
    per partition, how long the oldest instant that should have been decided or dispatched by now
    has been waiting (a due-index row not yet decided, or a fire not yet attempted). A partition
    with nothing waiting has no series; ``…_max_seconds`` is the maximum over partitions (0 when
    nothing waits), for dashboards. A stalled timing plane shows here while every process is healthy.
  - ``fireledger_lane_depth{lane,state}`` — live fires per lane.
  - ``fireledger_leases_held{owner}`` and ``fireledger_partitions_unleased`` — from the ``leases``
    table (read only); ``fireledger_node_eps_seconds{node,role,source}`` and
    ``fireledger_node_heartbeat_age_seconds{node,role}``, ``fireledger_node_shedding{node,role}`` —
    from ``nodes`` (running nodes only).
  - ``fireledger_store_up`` — 0 when the store could not be read (the scrape still answers).
  - ``fireledger_targets_verification_expiring{tenant}`` — verified targets whose ownership
    verification expires within 7 days (the automatic renewal has not succeeded yet; decision 0172).
  - ``fireledger_store_role{role}`` — 1 for the role of the server this process reaches (``primary``,
    ``standby``, ``embedded``, ``unreachable``; :mod:`fireledger.store.role`);
    ``fireledger_store_synchronous`` — 1 while the primary's commits wait for a synchronous standby
    (0: none streams, e.g. pg_auto_failover dropped to asynchronous after losing the standby);
    ``fireledger_store_sync_standbys``; ``fireledger_store_timeline`` — the primary's WAL timeline
    (every promotion increments it); ``fireledger_store_failovers_total`` — primary changes (another
    server or a higher timeline) this process has seen between its scrapes.

  The store's answers are reused for :data:`STORE_METRICS_TTL_S` (1 s): a scrape storm costs the
  store one reading a second.

No label ever carries a payload, a fire key or a tenant's data: labels are lanes, states, partitions
and node ids only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fireledger.store.role import ROLES, FailoverWatch, read_role

log = logging.getLogger("fireledger.observe")

LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
DUE_AGE = "fireledger_oldest_undispatched_due_age_seconds"
#: How long ``/metrics`` reuses the store's answers (seconds).
STORE_METRICS_TTL_S = 1.0
VERIFICATION_EXPIRING = "fireledger_targets_verification_expiring"
#: The gauge counts verifications expiring within this horizon (7 days: the renewal window).
EXPIRING_WITHIN_US = 7 * 86_400 * 1_000_000


class Metrics:
    """This process's own metrics (one registry per process)."""

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
        # The timing plane across nodes (fireledger.timing.leases / .shadow).
        self.partitions_owned = Gauge("fireledger_timing_partitions_owned",
                                      "Partitions this timing node may claim now", ["node"], registry=r)
        self.lease_takeover = Histogram("fireledger_lease_takeover_seconds",
                                        "Handover gap of each lease taken: from its release (cause released) "
                                        "or its previous owner's last renewal (expired, session-lost)",
                                        ["cause"], buckets=LATENESS_BUCKETS, registry=r)
        self.correlated_excursion = Gauge("fireledger_timing_correlated_excursion",
                                          "1 while most live timing nodes shed at once (a correlated clock "
                                          "excursion)", registry=r)
        self.shadow_divergence = Gauge("fireledger_shadow_divergence",
                                       "Due-index rows the shadow rebuilder found divergent in the latest "
                                       "report of every partition, by kind", ["kind"], registry=r)
        self.shadow_checked = Counter("fireledger_shadow_partitions_checked_total",
                                      "Partitions checked by this node's shadow rebuilder", registry=r)

    def render(self, *extra: CollectorRegistry) -> bytes:
        """The text exposition of this process's metrics followed by each ``extra`` registry."""
        return b"".join(generate_latest(reg) for reg in (self.registry, *extra))


class StoreCollector:
    """Cluster-wide metrics computed from the store at scrape time (see the module docstring).

    ``store`` is a :class:`~fireledger.store.Store`; ``clock`` a :class:`~fireledger.clock.Clock`
    (ages are measured from its *earliest* bound, so they are never overstated).

    The store's answers are cached for ``ttl_s`` seconds of this process's monotonic time (default
    :data:`STORE_METRICS_TTL_S`): scrapes closer together than that (several Prometheus servers, a
    scrape storm) cost the store its four queries once. ``ttl_s = 0`` reads the store every scrape.
    """

    def __init__(self, store: Any, clock: Any, *, ttl_s: float = STORE_METRICS_TTL_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if ttl_s < 0:
            raise ValueError("ttl_s: must be ≥ 0")
        self.store = store
        self.clock = clock
        self.ttl_s = ttl_s
        self.monotonic = monotonic   # the cache's age is read from this (tests step it)
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Metric]] | None = None
        self.failovers = FailoverWatch()

    def registry(self) -> CollectorRegistry:
        reg = CollectorRegistry()
        reg.register(self)
        return reg

    def describe(self) -> list[Metric]:
        return []   # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        """The families of the latest store reading (fresh when older than ``ttl_s``)."""
        with self._lock:   # concurrent scrapes wait for one reading instead of each making their own
            now = self.monotonic()
            if self._cached is None or now - self._cached[0] >= self.ttl_s or self.ttl_s == 0:
                self._cached = (now, [*self._read_role(), *self._read()])
            families = self._cached[1]
        return iter(families)

    def _read_role(self) -> Iterator[Metric]:
        """The store's role families (:mod:`fireledger.store.role`), read before anything else."""
        reading = read_role(self.store)
        count = self.failovers.observe(reading)
        role = GaugeMetricFamily("fireledger_store_role", "1 for the role of the store server this process "
                                 "reaches", labels=["role"])
        for name in ROLES:
            role.add_metric([name], 1.0 if reading.role == name else 0.0)
        yield role
        yield GaugeMetricFamily("fireledger_store_synchronous", "1 while commits wait for a synchronous standby",
                                value=1.0 if reading.synchronous else 0.0)
        yield GaugeMetricFamily("fireledger_store_sync_standbys", "Streaming synchronous standbys of the primary",
                                value=float(reading.sync_standbys))
        yield GaugeMetricFamily("fireledger_store_sync_required", "1 while synchronous_standby_names is set: "
                                "commits wait for a standby (stalled while none streams)",
                                value=1.0 if reading.sync_required else 0.0)
        yield GaugeMetricFamily("fireledger_store_timeline", "WAL timeline of the primary (each promotion "
                                "increments it; 0: not a PostgreSQL primary)", value=float(reading.timeline))
        yield CounterMetricFamily("fireledger_store_failovers", "Primary changes this process has seen",
                                  value=float(count))

    def _read(self) -> Iterator[Metric]:
        now_us = self.clock.now().earliest_us
        up = GaugeMetricFamily("fireledger_store_up", "1 when the store answered this scrape")
        try:
            waiting = self.store.history.due_waiting_by_partition(now_us)
            depths = self.store.history.lane_depths()
            leases = self.store.history.lease_rows()
            nodes = self.store.history.node_rows()
            expiring = self.store.trust.verification_expiring(now_us, now_us + EXPIRING_WITHIN_US)
        except Exception as exc:   # the scrape must answer even when the store does not
            log.warning("metrics: the store could not be read: %s", type(exc).__name__)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up

        age = GaugeMetricFamily(DUE_AGE, "Age of the oldest due instant not yet decided or dispatched, "
                                         "per partition (absent: nothing waiting)", labels=["partition"])
        ages = {p: max(0.0, (now_us - oldest) / 1e6) for p, oldest in waiting.items()}
        for p in sorted(ages):
            age.add_metric([str(p)], ages[p])
        yield age
        yield GaugeMetricFamily(DUE_AGE.replace("_seconds", "_max_seconds"),
                                "Maximum of the due age over partitions (0 when nothing waits)",
                                value=max(ages.values(), default=0.0))

        depth = GaugeMetricFamily("fireledger_lane_depth", "Live fires (pending, dispatching, or held by "
                                  "overlap policy queue) per lane",
                                  labels=["lane", "state"])
        for lane in ("on-time", "catch-up", "backfill"):
            for state in ("pending", "dispatching", "held"):
                depth.add_metric([lane, state], float(depths.get((lane, state), 0)))
        for (lane, state), n in sorted(depths.items()):
            if lane not in ("on-time", "catch-up", "backfill"):
                depth.add_metric([lane, state], float(n))
        yield depth

        held: dict[str, int] = {}
        unleased = 0
        for row in leases:
            if row.owner and row.expires_us > now_us:
                held[row.owner] = held.get(row.owner, 0) + 1
            else:
                unleased += 1
        lh = GaugeMetricFamily("fireledger_leases_held", "Partition leases held (unexpired) per owner",
                               labels=["owner"])
        for owner in sorted(held):
            lh.add_metric([owner], float(held[owner]))
        yield lh
        yield GaugeMetricFamily("fireledger_partitions_unleased",
                                "Partitions in the leases table with no live owner", value=float(unleased))

        eps = GaugeMetricFamily("fireledger_node_eps_seconds", "Last reported clock uncertainty ε per node",
                                labels=["node", "role", "source"])
        beat = GaugeMetricFamily("fireledger_node_heartbeat_age_seconds", "Time since each node's heartbeat",
                                 labels=["node", "role"])
        shed = GaugeMetricFamily("fireledger_node_shedding", "1 while a node claims nothing (ε over the ceiling)",
                                 labels=["node", "role"])
        for n in nodes:
            if n.eps_us is not None:
                eps.add_metric([n.id, n.role, n.eps_source or "unknown"], n.eps_us / 1e6)
            beat.add_metric([n.id, n.role], max(0.0, (now_us - n.heartbeat_us) / 1e6))
            shed.add_metric([n.id, n.role], 1.0 if n.shedding else 0.0)
        yield eps
        yield beat
        yield shed
        soon = GaugeMetricFamily(VERIFICATION_EXPIRING, "Verified targets whose ownership verification expires "
                                 "within 7 days, per tenant: automatic re-verification has not renewed them "
                                 "(yet, or it fails: see the target's verification.error)", labels=["tenant"])
        for tenant in sorted(expiring):
            soon.add_metric([tenant], float(expiring[tenant]))
        yield soon


METRICS = Metrics()

_CHILDREN: dict[tuple[int, tuple[str, ...]], Any] = {}


def labelled(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once per (metric, label values) in this process: the hot
    path (several per dispatch attempt) skips the library's lock and label validation."""
    key = (id(metric), labels)
    got = _CHILDREN.get(key)
    if got is None:
        got = _CHILDREN[key] = metric.labels(*labels)
    return got


__all__ = ["DUE_AGE", "LATENESS_BUCKETS", "METRICS", "STORE_METRICS_TTL_S", "VERIFICATION_EXPIRING", "Metrics",
           "StoreCollector", "labelled"]
