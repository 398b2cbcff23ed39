"""The loaded pg_auto_failover cluster of the ``store-…`` falsification scenarios (issue 16).

:func:`loaded_cluster` stands up a cluster on this machine (tests/hacluster.py: monitor, primary,
synchronous standby, the monitor's health checks tightened), migrates it, loads triggers of 1 s
(three tenants sharing ``shared`` of them, one tenant with ``own`` of its own; no jitter), starts
``fireledger control``, ``dispatch`` and two ``timing`` processes on the multi-host URL and a real
HTTP sink recording every delivery (each tenant's fires/s quota twice its steady rate:
:func:`_size_quotas`), waits until deliveries flow, then yields a :class:`Loaded`
while a :class:`MetricsWatch` scrapes the control plane's ``/metrics`` every 0.25 s and a
:class:`WriteProbe` commits on the store every 0.1 s (the store's own outage, as any client sees it). On exit it
stops everything and deletes the cluster.

:func:`finish` stops the timing processes (nothing new is decided), waits until dispatch has settled
every committed fire and reads the ledger from the primary; :func:`figures` computes what every
scenario reports: deliveries without a record, early deliveries, instants without (or with two)
records, lateness, time from the event to the first fire decided after it and to on-time delivery
for good, extra attempts; and ``cpu`` (:class:`CpuShare`): how busy the machine was and how much of
it the run's fireledger processes used.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
S = 1_000_000
_SAMPLE = re.compile(r"^(fireledger_store_(?:role|synchronous|sync_required|sync_standbys|timeline))"
                     r"(?:\{role=\"(\w+)\"\})? ([0-9.e+-]+)$", re.M)


class MetricsWatch:
    """Scrapes ``/metrics`` of ``base`` every ``interval_s`` on a thread: ``samples`` is a list of
    (wall-clock time, {family or family:role → value}); a failed scrape is a sample of ``{}``."""

    def __init__(self, base: str, interval_s: float = 0.25) -> None:
        self.base = base
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.time()
            got: dict[str, float] = {}
            try:
                with urllib.request.urlopen(self.base + "/metrics", timeout=5) as r:
                    text = r.read().decode()
                for name, role, value in _SAMPLE.findall(text):
                    got[f"{name}:{role}" if role else name] = float(value)
            except OSError:
                pass
            self.samples.append((at, got))
            self._stop.wait(self.interval_s)   # the scrape period, until stopped

    def first(self, after: float, key: str, value: float) -> float | None:
        """The first sample time after ``after`` where ``key`` had ``value`` (None: never)."""
        return next((at for at, got in list(self.samples) if at > after and got.get(key) == value), None)

    def last(self, key: str) -> float | None:
        return next((got[key] for _, got in reversed(list(self.samples)) if key in got), None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class WriteProbe:
    """Commits a transaction that holds a transaction id (``SELECT txid_current()``: a commit record,
    waited for by a synchronous standby) on ``url`` every ``interval_s`` on a thread, reconnecting
    through the multi-host URL after any failure; ``commits`` holds the wall-clock time each commit
    returned. :meth:`unwritable_s` is the store's own outage as any client saw it, independent of
    fireledger: what a switchover's lateness is judged against (decision 0263)."""

    def __init__(self, url: str, interval_s: float = 0.1) -> None:
        self.url = url
        self.interval_s = interval_s
        self.commits: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="write-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psycopg

        conn: Any = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.url, connect_timeout=2)
                conn.execute("SELECT txid_current()")
                conn.commit()
                self.commits.append(time.time())
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
            self._stop.wait(self.interval_s)   # the probe period, until stopped
        if conn is not None:
            conn.close()

    def unwritable_s(self, lo: float, hi: float) -> float | None:
        """The longest time between two successive commits where the gap overlaps ``lo … hi``,
        less the probe period (None: no commit after ``lo``, the store never came back)."""
        at = list(self.commits)
        gaps = [b - a for a, b in pairwise(at) if b >= lo and a <= hi]
        if not any(t >= lo for t in at):
            return None
        return round(max(0.0, max(gaps, default=0.0) - self.interval_s), 2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class CpuShare:
    """What the machine's CPUs did from construction to :meth:`figures`: ``machine_busy`` (fraction of
    every core not idle, /proc/stat) and ``fireledger_cores`` (cores the run's fireledger processes
    used, their utime + stime): a lagging run on a saturated machine whose CPU went mostly to other
    processes is the machine's limit, not fireledger's."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.t0, self.stat0, self.used0 = time.monotonic(), self._stat(), self._used()

    @staticmethod
    def _stat() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]   # all jiffies, idle + iowait

    def _used(self) -> float:
        total = 0
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
            except (OSError, ValueError, IndexError):
                continue
        return total / os.sysconf("SC_CLK_TCK")

    def figures(self) -> dict[str, float]:
        (all1, idle1), span = self._stat(), max(1e-6, time.monotonic() - self.t0)
        busy = 1 - (idle1 - self.stat0[1]) / max(1, all1 - self.stat0[0])
        return {"machine_busy": round(busy, 2), "fireledger_cores": round((self._used() - self.used0) / span, 2)}


@dataclass
class Loaded:
    """A running loaded cluster (see the module docstring)."""

    cluster: Any
    url: str
    sink: Any
    procs: list[Any]
    triggers: list[str]
    started: float                       # wall clock: deliveries flowing, the warm-up begins
    watch: MetricsWatch
    out: dict[str, Any] = field(default_factory=dict)
    cpu: CpuShare | None = None
    probe: WriteProbe | None = None

    def wait(self, until: float) -> None:
        from e2e import wait_until

        wait_until(lambda: time.time() >= until, max(0.0, until - time.time()) + 5, "the run", interval_s=0.2)


#: Each tenant's fires/s quota, as a multiple of its steady rate (decision 0201).
QUOTA_HEADROOM = 2.0


def _size_quotas(store: Any, rates: dict[str, int]) -> None:
    """Give every tenant a fires/s quota of :data:`QUOTA_HEADROOM` × its steady rate when the default
    (100/s) is below that, as an operator sizes a tenant's quota: at exactly the steady rate (or
    under it: 300 triggers of 1 s in one tenant) the backlog of any pause can drain only through
    over-quota spare capacity, and the scenario would measure the shedding order, not the store."""
    for tenant_id, rate in rates.items():
        want = QUOTA_HEADROOM * rate
        if want > 100:
            store.dispatch.set_tenant_quota(tenant_id, fires_per_s=want)


def _load(store: Any, sink: Any, shared: int, own: int) -> list[str]:
    """Three tenants sharing ``shared`` triggers of 1 s, one tenant with ``own``; their trigger ids.
    Quotas sized by :func:`_size_quotas`."""
    from fireledger.clock import SystemClock
    from fireledger.domain.model import Policies
    from storekit import add_target, add_tenant, add_trigger

    now = SystemClock().now().latest_us
    ids = []
    tenants = [add_tenant(store, f"shared{i}") for i in range(3)]
    targets = [add_target(store, t, url=f"{sink.base_url}/ok", secret=SECRET) for t in tenants]
    for i in range(shared):
        t, tg = tenants[i % 3], targets[i % 3]
        ids.append(add_trigger(store, t, tg, {"every": "1s"}, now_us=now, policies=Policies(timeout_s=5.0))[0].id)
    big = add_tenant(store, "big")
    big_target = add_target(store, big, url=f"{sink.base_url}/ok", secret=SECRET)
    for _ in range(own):
        ids.append(add_trigger(store, big, big_target, {"every": "1s"}, now_us=now,
                               policies=Policies(timeout_s=5.0))[0].id)
    rates = {t.id: len(range(i, shared, 3)) for i, t in enumerate(tenants)}
    _size_quotas(store, {**rates, big.id: own})
    return ids


@contextmanager
def loaded_cluster(shared: int, own: int, warmup_s: float, prefix: str) -> Iterator[Loaded]:
    from e2e import Service, cli, wait_until
    from fireledger.store import Store
    from hacluster import HaCluster
    from sink import SinkServer

    work = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = HaCluster()
    sink = SinkServer(secrets=[SECRET])
    sink.start_in_thread()
    procs: list[Any] = []
    watch: MetricsWatch | None = None
    probe: WriteProbe | None = None
    try:
        t0 = time.monotonic()
        url = cluster.up()
        up_s = round(time.monotonic() - t0, 1)
        cli("db", "upgrade", "--db", url)
        store = Store.open(url)
        try:
            triggers = _load(store, sink, shared, own)
        finally:
            store.close()
        env = {"FIRELEDGER_KEYRING": str(work / "keys.json")}
        control = Service(url, work, command="control", env=env).start(timeout_s=60)
        procs += [control, Service(url, work, command="dispatch", env=env).start()]
        procs += [Service(url, work, command="timing", env=env).start() for _ in range(2)]
        watch = MetricsWatch(control.base)
        probe = WriteProbe(url)
        wait_until(lambda: len(sink.records()) >= len(triggers), 60, "deliveries to flow", interval_s=0.2)
        run = Loaded(cluster, url, sink, procs, triggers, time.time(), watch,
                     {"triggers": len(triggers), "cluster_up_s": up_s, "workdir": str(work)},
                     CpuShare([p.proc.pid for p in procs]), probe)
        run.wait(run.started + warmup_s)
        yield run
    finally:
        if watch is not None:
            watch.stop()
        if probe is not None:
            probe.stop()
        for p in procs:
            p.stop()
        sink.stop()
        cluster.down()


def _wait_settled(url: str, timeout_s: float) -> bool:
    import psycopg

    from e2e import wait_until

    def settled() -> bool:
        try:
            with psycopg.connect(url, connect_timeout=5) as c:
                row = c.execute("SELECT COUNT(*) FROM fires WHERE state IN ('pending', 'dispatching')").fetchone()
                return row is not None and row[0] == 0
        except psycopg.Error:
            return False

    try:
        wait_until(settled, timeout_s, "every committed fire to settle", interval_s=0.5)
        return True
    except TimeoutError:
        return False


def finish(run: Loaded) -> list[tuple[Any, ...]]:
    """Stop the timing processes, wait (≤ 60 s) for dispatch to settle what is committed (sets
    ``settled``), and return the fires as the primary holds them (tenant, trigger, scheduled, seq,
    state, cause, decided, attempts)."""
    import psycopg

    if run.cpu is not None:
        run.out["cpu"] = run.cpu.figures()   # from the warm-up's start to the end of the run
    for p in run.procs[2:]:
        p.stop()
    run.out["settled"] = _wait_settled(run.url, 60)
    with psycopg.connect(run.url, connect_timeout=10) as c:
        return c.execute("SELECT tenant_id, trigger_id, scheduled_us, seq, state, cause, decided_us, attempts "
                         "FROM fires").fetchall()


def _instants(fires: list[tuple[Any, ...]], triggers: list[str], lo: int, hi: int) -> dict[str, Any]:
    """Instants of the window [lo, hi] (µs) without a record, with two, and their records' states."""
    per_instant = Counter((r[1], int(r[2])) for r in fires if lo <= int(r[2]) <= hi)
    grid: dict[str, list[int]] = {}
    for (trig, at) in per_instant:
        grid.setdefault(trig, []).append(at)
    missing = 0
    for trig in set(triggers):
        ats = sorted(grid.get(trig, []))
        if not ats:
            missing += int((hi - lo) / S)
            continue
        # Each trigger's instants are 1 s apart: count the holes between its first and last in the window.
        missing += sum((b - a) // S - 1 for a, b in pairwise(ats))
    return {"instants_checked": sum(per_instant.values()), "instants_without_record": missing,
            "instants_with_two_records": sum(1 for n in per_instant.values() if n > 1),
            "undelivered_in_window": sum(1 for r in fires if lo <= int(r[2]) <= hi and r[4] != "delivered")}


def figures(fires: list[tuple[Any, ...]], records: list[dict[str, Any]], event_at: float,
            window: tuple[float, float], triggers: list[str]) -> dict[str, Any]:
    """The figures every ``store-…`` scenario reports (module docstring), ``event_at`` being the
    kill or the switchover's start (wall clock)."""
    from fireledger.domain.keys import FireKey

    by_key = {(r[0], r[1], int(r[2]), int(r[3])): r for r in fires}
    out: dict[str, Any] = {"fires": len(fires), "states": dict(Counter(r[4] for r in fires)),
                           "causes": dict(Counter(r[5] for r in fires if r[5]))}
    keys = [FireKey.parse(rec["fire_key"]) for rec in records]
    delivered = [(k.tenant_id, k.trigger_id, k.scheduled_us, k.seq) for k in keys]
    seen = [(k.scheduled_us / S, rec["arrived_at"]) for k, rec in zip(keys, records, strict=True)]
    out["deliveries"] = len(records)
    out["deliveries_without_record"] = sum(1 for k in set(delivered) if k not in by_key)
    out["early_deliveries"] = sum(1 for at, arrived in seen if arrived < at)
    out.update(_instants(fires, triggers, int(window[0] * S), int(window[1] * S)))
    after = [int(r[6]) for r in fires if int(r[6]) > event_at * S]
    out["rto_decided_s"] = round((min(after) - event_at * S) / S, 2) if after else None
    on_time = [arrived for at, arrived in seen if arrived > event_at and arrived - at <= 1.0]
    out["rto_on_time_s"] = round(min(on_time) - event_at, 2) if on_time else None
    lateness = sorted(arrived - at for at, arrived in seen if window[0] <= at <= window[1])
    out["max_lateness_s"] = round(lateness[-1], 3) if lateness else None
    out["late_over_5s"] = sum(1 for x in lateness if x > 5.0)
    tail = sorted(arrived - at for at, arrived in seen if window[1] - 3 <= arrived <= window[1])
    out["lateness_at_end_p50_s"] = round(tail[len(tail) // 2], 3) if tail else None
    before = sorted(arrived - at for at, arrived in seen if window[0] <= arrived <= event_at)
    out["lateness_before_event_p50_s"] = round(before[len(before) // 2], 3) if before else None
    out.update(_recovery(seen, event_at, window[1]))
    decided = sorted(int(r[6]) for r in fires if window[0] * S <= int(r[6]) <= window[1] * S)
    out["write_stall_s"] = round(max((b - a for a, b in pairwise(decided)), default=0) / S, 2)
    extra = [int(r[7]) - 1 for r in fires if r[4] == "delivered"]
    out["extra_attempts_per_fire"] = round(sum(extra) / max(1, len(extra)), 4)
    out["max_extra_attempts"] = max(extra, default=0)
    out["duplicate_deliveries"] = sum(n - 1 for n in Counter(delivered).values())
    return out


def _recovery(seen: list[tuple[float, float]], event_at: float, end: float) -> dict[str, Any]:
    """How soon delivery was on time again for good: ``on_time_again_s`` — event → the instant after
    which every delivered instant (up to ``end``) arrived within 1 s of it; ``backlog_drained_s`` —
    event → the arrival of the last delivery of an instant scheduled before that point."""
    late = [at for at, arrived in seen if event_at - 1 <= at <= end and arrived - at > 1.0]
    again = max(late, default=event_at)
    backlog = [arrived for at, arrived in seen if event_at - 1 <= at <= again]
    return {"on_time_again_s": round(again - event_at, 2),
            "backlog_drained_s": round(max(backlog) - event_at, 2) if backlog else 0.0}


def records_failures(out: dict[str, Any]) -> list[str]:
    """What every ``store-…`` scenario requires of the ledger and the deliveries."""
    failures = []
    if out["deliveries_without_record"]:
        failures.append(f"{out['deliveries_without_record']} deliveries have no record on the primary")
    if out["instants_without_record"]:
        failures.append(f"{out['instants_without_record']} instants have no record")
    if out["instants_with_two_records"]:
        failures.append(f"{out['instants_with_two_records']} instants have two records")
    if out["early_deliveries"]:
        failures.append(f"{out['early_deliveries']} deliveries arrived before their instant")
    if not out.get("settled"):
        failures.append("committed fires did not settle after the run")
    return failures
