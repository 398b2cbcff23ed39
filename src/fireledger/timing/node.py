"""A timing node: the loop with its lease manager, shadow rebuilder and definition listener.

``TimingNode.build(store, clock, node_id)`` assembles what a ``fireledger timing`` (or ``serve``)
process runs:

* the :class:`~fireledger.timing.loop.TimingLoop` (its clock wrapped in a
  :class:`~fireledger.timing.clockguard.StepGuardClock`);
* on PostgreSQL a :class:`~fireledger.timing.leases.LeaseManager` on its own thread, so the loop
  claims only the partitions this node holds; on SQLite (the embedded default: one process) the
  loop owns every partition. ``FIRELEDGER_TIMING_LEASES=1`` / ``0`` forces either;
* a :class:`~fireledger.timing.shadow.ShadowRebuilder` on its own thread (both engines);
* without leases (the embedded default) an :class:`UnleasedSession` on its own thread: the node's
  session row (role ``timing-all``: it claims every partition) with its ε and source, refreshed every
  second and marked stopped on a clean stop, so ``fireledger status`` shows the running node — the
  lease manager keeps the row of a leased node;
* on PostgreSQL a :class:`DefinitionListener`: ``LISTEN fireledger_definitions`` (notified by the
  store's definition counter, migration 0002) wakes the loop the moment a trigger is created,
  amended, paused or resumed by any control process; the loop's capped sleep stays the fallback.

Each thread uses its own store connection. ``stop()`` stops the loop; ``run()`` then stops the
threads and releases every lease at once (a clean stop hands over without waiting for expiry).

A ``fireledger timing`` process has no HTTP API; ``FIRELEDGER_METRICS_LISTEN=HOST:PORT`` serves this
process's own metrics (ε and shedding, partitions owned, lease takeovers, shadow divergence) in the
Prometheus text format at ``http://HOST:PORT/metrics`` — also while the node sheds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fireledger.clock import Clock
from fireledger.domain.model import NewFire
from fireledger.settings import Settings
from fireledger.store import Store, StoreError
from fireledger.store.engine import dead_peer_options
from fireledger.store.listen import DEFINITIONS_CHANNEL, ChannelListener
from fireledger.waker import Waker

from .clockguard import StepGuardClock
from .leases import LeaseManager, LeaseSettings
from .loop import TimingLoop
from .shadow import ShadowRebuilder, ShadowSettings

log = logging.getLogger("fireledger.timing")

CHANNEL = DEFINITIONS_CHANNEL


class DefinitionListener(ChannelListener):
    """``LISTEN`` for definition changes on a dedicated PostgreSQL connection; ``on_change()`` per
    notification. Reconnects after an error (the loop's capped sleep covers the gap)."""

    def __init__(self, url: str, on_change: Callable[[], None], channel: str = CHANNEL) -> None:
        super().__init__(url, on_change, channel, what="definition listener")


class ServerClockProbe:
    """``SELECT clock_timestamp()`` for the clock cross-check over one dedicated connection.

    (``store.server_time_us`` from the cross-check's probe threads would open a new thread-local
    connection per probe and keep it.) Only one probe runs at a time; a probe that finds another in
    flight fails fast and the cross-check keeps its last measurement."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._conn: Any = None

    def __call__(self) -> int:
        if not self.store.engine.caps.server_clock:
            return self.store.server_time_us()
        import psycopg

        if not self._lock.acquire(timeout=5.0):
            raise StoreError("a clock probe is already in flight")
        try:
            if self._conn is None or self._conn.closed:
                url = getattr(self.store.engine, "url", "")
                self._conn = psycopg.connect(url, autocommit=True, connect_timeout=5, **dead_peer_options(url))
            try:
                row = self._conn.execute(self.store.q["server_time_us"]).fetchone()
            except Exception:
                self._conn.close()
                self._conn = None
                raise
            return int(row[0])
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class UnleasedSession:
    """The session row of a timing node that holds no leases (it claims every partition: SQLite's
    embedded ``serve``). Role ``timing-all``, so lease managers, which balance role ``timing``, never
    count it. ``shedding`` mirrors the loop's rule (ε above the ceiling). Rows of nodes silent for
    ``prune_after_s`` (killed without a clean stop) are forgotten."""

    ROLE = "timing-all"

    def __init__(self, store: Store, clock: Clock, node_id: str, *, eps_ceiling_us: int,
                 interval_s: float = 1.0, prune_after_s: float = 3600.0) -> None:
        self.store = store
        self.clock = clock
        self.node_id = node_id
        self.eps_ceiling_us = eps_ceiling_us
        self.interval_s = interval_s
        self.prune_after_s = prune_after_s
        self.started_us = clock.now().earliest_us
        self.beats = 0

    def beat(self) -> None:
        """Write the session row once: heartbeat, ε and its source, shedding."""
        iv = self.clock.now()
        now = iv.earliest_us
        self.store.timing.heartbeat(self.node_id, self.ROLE, now_us=now, started_us=self.started_us, eps_us=iv.eps_us,
                             eps_source=iv.source, shedding=iv.eps_us > self.eps_ceiling_us, lease_expires_us=now)
        if self.beats % 60 == 0:
            self.store.timing.prune_nodes(self.ROLE, now - int(self.prune_after_s * 1_000_000))
        self.beats += 1

    def run(self, stop: Waker) -> None:
        """Beat every ``interval_s`` until ``stop``; then mark the session stopped. A failed beat is
        logged and tried again (the fire path does not depend on this row)."""
        try:
            while True:
                try:
                    self.beat()
                except Exception as exc:
                    log.warning("node %s: session heartbeat failed: %s", self.node_id, exc)
                if stop.wait(self.interval_s):
                    break
        finally:
            try:
                self.store.timing.stop_node(self.node_id, self.clock.now().earliest_us)
            except Exception as exc:
                log.warning("node %s: could not mark the session stopped: %s", self.node_id, exc)


class TimingNode:
    """The timing plane of one process (see the module docstring)."""

    def __init__(self, store: Store, loop: TimingLoop, *, leases: LeaseManager | None,
                 shadow: ShadowRebuilder | None, listener: DefinitionListener | None,
                 session: UnleasedSession | None = None) -> None:
        self.store = store
        self.session = session
        self.loop = loop
        self.leases = leases
        self.shadow = shadow
        self.listener = listener
        self._stop = Waker()   # the threads' timed waits return under a faked clock (waker.py)
        self._threads: list[threading.Thread] = []
        self._metrics_server: Any = None

    @classmethod
    def build(cls, store: Store, clock: Clock, node_id: str, *,
              on_committed: Callable[[Sequence[NewFire]], None] = lambda fires: None,
              lease_settings: LeaseSettings | None = None, shadow_settings: ShadowSettings | None = None,
              leases: bool | None = None, shadow: bool | None = None, listen: bool | None = None,
              settings: Settings | None = None) -> TimingNode:
        """Assemble a node; ``None`` flags follow the engine and ``settings`` (module docstring).
        Without ``settings`` they are read from the environment here; bad settings raise
        ``ValueError`` naming the variable."""
        if settings is None:
            settings = Settings.from_env()
        caps = store.engine.caps
        if leases is None:
            leases = caps.networked if settings.timing_leases is None else settings.timing_leases
        use_leases = leases
        use_shadow = (settings.shadow is not False) if shadow is None else shadow
        use_listen = caps.notify if listen is None else (listen and caps.notify)
        guarded = StepGuardClock(clock)
        lease_cfg = lease_settings or settings.leases
        manager = LeaseManager(store, guarded, node_id, lease_cfg) if use_leases else None
        loop = TimingLoop(store, guarded, node_id, on_committed=on_committed, leases=manager,
                          eps_ceiling_us=lease_cfg.eps_ceiling_us, miss_threshold_us=settings.miss_threshold_us,
                          gather_s=settings.pacing.timing_gather_s, max_sleep_s=settings.pacing.timing_max_sleep_s)
        if manager is not None:
            manager.on_change = loop.wake_threadsafe
        rebuilder = None
        if use_shadow:
            st = shadow_settings or ShadowSettings(settings.shadow_interval_s)
            rebuilder = ShadowRebuilder(store, guarded, node_id, st)
        listener = None
        if use_listen:
            listener = DefinitionListener(getattr(store.engine, "url", ""), loop.wake_threadsafe)
        store.timing.ensure_partitions()
        session = None if manager is not None else UnleasedSession(store, guarded, node_id,
                                                                   eps_ceiling_us=lease_cfg.eps_ceiling_us)
        node = cls(store, loop, leases=manager, shadow=rebuilder, listener=listener, session=session)
        node.serve_metrics(settings.metrics_listen)
        return node

    @property
    def node_id(self) -> str:
        return self.loop.node_id

    def wake(self) -> None:
        """A definition changed in this process: re-read the due index now (event-loop thread)."""
        self.loop.wake()

    def stop(self) -> None:
        self.loop.stop()

    def _start(self, name: str, target: Callable[[Waker], None]) -> None:
        t = threading.Thread(target=target, args=(self._stop,), name=f"timing-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def serve_metrics(self, address: tuple[str, int] | None = None) -> tuple[str, int] | None:
        """Serve this process's metrics at ``address`` (``Settings.metrics_listen``, from
        ``FIRELEDGER_METRICS_LISTEN``); None: not served. Returns the address."""
        if address is None:
            return None
        host, port = address
        listen = f"{host}:{port}"
        from prometheus_client import start_http_server

        from fireledger.observe.metrics import METRICS

        try:
            server, _thread = start_http_server(int(port), host.strip("[]") or "127.0.0.1",
                                                registry=METRICS.registry)
        except OSError as exc:
            raise ValueError(f"FIRELEDGER_METRICS_LISTEN: cannot listen on {listen}: {exc.strerror}") from None
        self._metrics_server = server
        log.info("timing node %s serves its metrics at http://%s:%s/metrics", self.node_id, host, port)
        return host, int(port)

    async def run(self) -> None:
        """Run until :meth:`stop`; then stop the threads and release every lease."""
        if self.leases is not None:
            self._start("leases", self.leases.run)
        if self.shadow is not None:
            self._start("shadow", self.shadow.run)
        if self.listener is not None:
            self._start("listen", self.listener.run)
        if self.session is not None:
            self._start("session", self.session.run)
        log.info("timing node %s: %s, shadow rebuilder %s, definition notifications %s", self.node_id,
                 "partition leases" if self.leases is not None else "every partition (single node)",
                 "on" if self.shadow is not None else "off", "on" if self.listener is not None else "off")
        try:
            await self.loop.run()
        finally:
            self._stop.set()
            for t in self._threads:
                t.join(timeout=5)
            if self.leases is not None:
                self.leases.stop()
            if self._metrics_server is not None:
                self._metrics_server.shutdown()


__all__ = ["CHANNEL", "DefinitionListener", "ServerClockProbe", "TimingNode", "UnleasedSession"]
