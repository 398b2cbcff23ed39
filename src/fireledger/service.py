"""Running the planes: ``serve`` (all three in one process) or each role alone.

On SQLite ``serve`` is the embedded default: one process, one clock. On PostgreSQL any number of
``timing``, ``dispatch`` and ``control`` processes may run against one database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fireledger.children import end_with_parent, supervise_dispatchers
from fireledger.clock import Clock, CrossCheckedClock, SystemClock
from fireledger.dispatch.credentials import KeyRingFile
from fireledger.domain.model import NewFire
from fireledger.recurrence import TZDATA_VERSION
from fireledger.retention import retention_loop
from fireledger.reverify import reverify_loop
from fireledger.security.envelope import cipher_for, seal_stored_secrets
from fireledger.security.tenancy import purge_loop
from fireledger.settings import Settings, parse_dispatch_processes, parse_trusted_proxies, process_env
from fireledger.stopping import StopGuard
from fireledger.store import Store, StoreError
from fireledger.store.engine import SqliteEngine
from fireledger.waker import Waker

if TYPE_CHECKING:   # imported where they run (startup time); named here for the annotations
    import uvicorn
    from fastapi import FastAPI

    from fireledger.dispatch.runner import Dispatcher
    from fireledger.replication import LitestreamPlan
    from fireledger.timing import TimingNode

log = logging.getLogger("fireledger.service")


def keyring_path(store: Store | None = None, settings: Settings | None = None) -> str:
    """Where the dispatch signing keys live: ``FIRELEDGER_KEYRING`` (from ``settings``, else the
    environment), else ``keys.json`` in the state directory (:mod:`fireledger.statedir`; never the
    working directory). Every dispatch and control process must see the same file."""
    from fireledger.statedir import state_dir

    explicit = settings.keyring if settings is not None else process_env().get("FIRELEDGER_KEYRING")
    if explicit:
        return explicit
    return str(state_dir() / "keys.json")


def open_keyring(store: Store | None = None, settings: Settings | None = None) -> KeyRingFile:
    """The key ring of this deployment, checked: the state directory must not be open to group or
    others, nor the ring file (``ValueError`` naming the file and the ``chmod`` that fixes it). A
    missing ring is created (mode 0600): a new signing key loses nothing, receivers refetch the JWKS."""
    from fireledger.statedir import StateDirError, ensure_state_dir, is_in_state_dir, private_file_problem

    path = keyring_path(store, settings)
    if is_in_state_dir(path):
        try:
            ensure_state_dir()
        except StateDirError as exc:
            raise ValueError(str(exc)) from None
    problem = private_file_problem(path, "key ring")
    if problem is not None:
        raise ValueError(problem)
    return KeyRingFile(path)


def dispatch_child() -> None:
    """Entry of ``serve``'s extra dispatch processes (:func:`fireledger.children.dispatch_child_command`:
    ``python -c ... PARENT_PID DB``, without the command line's imports): ``fireledger dispatch --db DB``
    that ends with ``serve`` (SIGTERM when it dies, ``kill -9`` included; decision 0240) and leaves the WAL
    checkpoints to it. A bad setting prints one line and exits 2, as the command does."""
    from fireledger.dispatch.internal import load_modules

    parent, db = int(sys.argv[1]), sys.argv[2]
    end_with_parent(parent)
    try:
        settings = Settings.from_env()
        load_modules(settings.internal_modules)
        run(db, ("dispatch",), None, settings, supervised=True)
    except (StoreError, ValueError) as exc:
        print(f"fireledger: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def dispatch_processes(env: dict[str, str] | None = None) -> int:
    """``FIRELEDGER_DISPATCH_PROCESSES`` (default ``min(usable cores, 2)``, decision 0239): how many
    processes ``serve`` dispatches from.

    An attempt runner is bound by one core (Python's interpreter lock); ``serve`` with N > 1 starts
    N − 1 extra ``fireledger dispatch`` processes on the same store, which share the lanes the way
    any dispatch processes do (claims are compare-and-set inside a write transaction, so nothing is
    leased twice). Raises ``ValueError`` naming the variable."""
    return parse_dispatch_processes(process_env() if env is None else env)


def node_id(role: str) -> str:
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def trusted_proxies(env: dict[str, str] | None = None) -> list[str]:
    """``FIRELEDGER_TRUSTED_PROXIES``: comma-separated addresses or networks of reverse proxies
    whose ``X-Forwarded-Proto``/``X-Forwarded-For`` the control plane believes (empty: none; the
    scheme is then the connection's own). A malformed entry raises ``ValueError`` naming it."""
    return list(parse_trusted_proxies(process_env() if env is None else env))


def bind_listen(listen: str) -> socket.socket:
    """The control plane's listening socket, bound before any plane starts: an address in use or not
    ours is one line naming ``--listen`` (``ValueError``), not a half-started process."""
    host, port = parse_listen(listen)
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ValueError(f"--listen: {listen!r}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise ValueError(f"--listen: {listen!r}: {exc.strerror or exc}") from None
    return sock


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen: {listen!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


@dataclass
class _Planes:
    """The planes one process started: their tasks and handles, for the bounded stop."""

    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    dispatcher: Dispatcher | None = None
    timing: TimingNode | None = None
    server: uvicorn.Server | None = None
    app: FastAPI | None = None
    fire_listener: Waker | None = None   # set to stop the dispatcher's LISTEN thread (0221)


def _process_clock(store: Store, settings: Settings) -> Clock:
    """The clock every plane of this process reads: the system clock (the declared bound ε when the
    kernel gives none, said once in a warning), cross-checked against the PostgreSQL server's clock on
    one dedicated connection when the store is PostgreSQL."""
    from fireledger.timing.node import ServerClockProbe

    system = SystemClock(settings.declared_eps_us)
    clock: Clock = system
    if store.engine.caps.server_clock:
        clock = CrossCheckedClock(system, ServerClockProbe(store))  # one dedicated connection
    iv = system.now()
    if iv.source == "declared":
        log.warning(
            "the kernel reports its clock unsynchronised; using the declared bound ε = %.1f ms "
            "(FIRELEDGER_DECLARED_EPS_MS). Every fire records this source.", iv.eps_us / 1000)
    return clock


def _start_planes(store: Store, clock: Clock, roles: Sequence[str], listen: str | None,
                  keys: KeyRingFile | None, listen_socket: socket.socket | None, settings: Settings) -> _Planes:
    """Start the dispatch, timing and control planes named in ``roles`` as tasks of the running loop,
    in that order: a timing commit wakes this process's dispatcher, a definition change wakes its
    timing loop (each only when that plane runs here)."""
    from fireledger.timing import TimingNode

    loop = asyncio.get_running_loop()
    planes = _Planes()
    issuer = settings.issuer or f"http://{listen or '127.0.0.1:8080'}"
    if "dispatch" in roles:
        from fireledger.dispatch.runner import Dispatcher  # imported only where it runs (startup time)

        planes.dispatcher = Dispatcher.from_settings(store, clock, node_id("dispatch"), settings, keys=keys,
                                                     issuer=issuer)
        planes.tasks.append(asyncio.create_task(planes.dispatcher.run(), name="dispatch"))
        if "timing" not in roles:   # with timing here, its commits hand off in-process (0195): no second wake
            planes.fire_listener = _listen_for_fires(store, planes.dispatcher, loop)
    if "timing" in roles:
        def committed(_fires: Sequence[NewFire]) -> None:
            if planes.dispatcher is not None:
                planes.dispatcher.wake_threadsafe(loop)
        # Partition leases, shadow rebuilder and definition notifications on PostgreSQL (timing/node.py).
        planes.timing = TimingNode.build(store, clock, node_id("timing"), on_committed=committed, settings=settings)
        planes.tasks.append(asyncio.create_task(planes.timing.run(), name="timing"))
    if "control" in roles:
        _start_control(planes, store, clock, listen, keys, listen_socket, settings)
    return planes


def _listen_for_fires(store: Store, dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop) -> Waker | None:
    """On an engine that notifies (PostgreSQL): ``LISTEN fireledger_fires`` on a dedicated connection
    and wake ``dispatcher`` per notification — fires committed by a timing plane in any process are
    claimed at once instead of at the idle poll, which stays the backstop when the listener is down
    (decision 0221). On SQLite the same through the fires bell (``<db>-fires.bell``, decision 0256).
    Returns the event that stops the watcher; None when there is nothing to watch."""
    if not store.engine.caps.notify:
        # SQLite: the fires bell next to the database, rung after each such commit (decision 0256).
        bell = store.engine.fires_bell
        return None if bell is None else bell.watch(lambda: dispatcher.wake_threadsafe(loop), name="dispatch-bell")
    from fireledger.store.listen import FIRES_CHANNEL, ChannelListener

    listener = ChannelListener(getattr(store.engine, "url", ""), lambda: dispatcher.wake_threadsafe(loop),
                               FIRES_CHANNEL, what="fire listener")
    return listener.start("dispatch-listen")


def _start_control(planes: _Planes, store: Store, clock: Clock, listen: str | None, keys: KeyRingFile | None,
                   listen_socket: socket.socket | None, settings: Settings) -> None:
    """Serve the API with uvicorn (bounded heads, head time and connections: decision 0092; forwarded
    headers trusted from the trusted proxies only: 0084) on ``listen_socket`` when given, else on
    ``listen``; sets ``planes.server``, ``planes.app`` and adds the "control" task. The StopGuard,
    not uvicorn, owns SIGTERM/SIGINT."""
    import uvicorn

    from fireledger.control.app import create_app
    from fireledger.control.httpproto import BoundedHttpToolsProtocol

    loop = asyncio.get_running_loop()

    def changed() -> None:
        if planes.timing is not None:
            loop.call_soon_threadsafe(planes.timing.wake)
    class _Server(uvicorn.Server):
        """uvicorn without its own signal handlers: the StopGuard owns SIGTERM/SIGINT and sets
        ``should_exit`` (uvicorn's handlers would replace the guard's while it serves)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    planes.app = create_app(store, clock, on_definition_change=changed, keys=keys, settings=settings)
    host, port = parse_listen(listen or "127.0.0.1:8080")
    trusted = list(settings.trusted_proxies)   # X-Forwarded-Proto/-For trusted from these only (0084)
    # Bounded heads, head time and connections (decision 0092); bodies: control/bodylimit.py.
    planes.server = _Server(uvicorn.Config(
        planes.app, host=host, port=port, log_level="warning", http=BoundedHttpToolsProtocol, access_log=False,
        lifespan="off", proxy_headers=bool(trusted), forwarded_allow_ips=trusted or None,
        timeout_graceful_shutdown=max(1, int(settings.stop_timeout_s * 0.4))))
    sockets = [listen_socket] if listen_socket is not None else None
    planes.tasks.append(asyncio.create_task(planes.server.serve(sockets=sockets), name="control"))
    log.info("control plane listening on http://%s:%d (tzdata %s, store %s)",
             host, port, TZDATA_VERSION, store.engine_name)


async def _run(store: Store, roles: Sequence[str], listen: str | None, db: str | None = None,
               keys: KeyRingFile | None = None, listen_socket: socket.socket | None = None,
               settings: Settings | None = None, replica: LitestreamPlan | None = None) -> None:
    """Run ``roles`` in this event loop until a signal or until one plane ends, then stop them all
    within ``settings.stop_timeout_s`` (invariant 17). The control role also runs the tenant purge
    and history retention jobs and, with ``db`` and more than one role, supervises the extra dispatch
    processes (``FIRELEDGER_DISPATCH_PROCESSES``). With ``replica`` it supervises Litestream, which is
    stopped after the planes (its final sync ships their last commits)."""
    import uvloop  # noqa: F401  (the policy is installed by the caller)

    if settings is None:
        settings = Settings.from_env()
    clock = _process_clock(store, settings)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # Bounded stop (invariant 17): SIGTERM/SIGINT start a drain with a deadline and arm a watchdog
    # that ends the process at FIRELEDGER_STOP_TIMEOUT_S whatever is still running.
    stop_s = settings.stop_timeout_s
    def signal_stop() -> None:
        loop.call_soon_threadsafe(stop.set)

    guard = StopGuard(stop_s, signal_stop)
    guard.install()
    if keys is None and {"control", "dispatch"} & set(roles):
        keys = open_keyring(store, settings)
    planes = _start_planes(store, clock, roles, listen, keys, listen_socket, settings)
    jobs: list[asyncio.Task[None]] = []
    if "control" in roles:
        # Deleted tenants are purged (definitions, payloads, history) by the control plane's job.
        jobs.append(asyncio.create_task(purge_loop(store), name="purge"))
        # History past the retention window is archived and purged by the control plane's job.
        jobs.append(asyncio.create_task(retention_loop(store, clock, settings=settings), name="retention"))
        # Verifications near their expiry are renewed, and lapsed ones marked, by the control plane (0170).
        jobs.append(asyncio.create_task(reverify_loop(store, clock, settings.verification,
                                                      allow_private=settings.allow_private_targets), name="reverify"))
    # The due age (per partition) is read from the store at scrape time by the control plane's
    # /metrics (fireledger.observe.metrics.StoreCollector), so it is right whichever planes run here.
    waiter = asyncio.create_task(stop.wait())
    extra = settings.dispatch_processes - 1 if "dispatch" in roles and db is not None and len(roles) > 1 else 0
    supervisor = (asyncio.create_task(supervise_dispatchers(db, extra, stop, grace_s=stop_s * 0.7))
                  if extra and db else None)
    replica_stop = asyncio.Event()
    replicator = None
    if replica is not None:
        from fireledger.observe.metrics import METRICS
        from fireledger.observe.replica import ReplicaCollector
        from fireledger.replication import ChildWatch, supervise_litestream

        child = ChildWatch()   # /metrics: fireledger_replica_up and _lag_seconds (decision 0200)
        METRICS.registry.register(ReplicaCollector(replica.db_path, replica.replica, child.running, replica.sync_s))
        replicator = asyncio.create_task(supervise_litestream(replica, stop, replica_stop, grace_s=stop_s * 0.1,
                                                              watch=child), name="litestream")
    done, _ = await asyncio.wait([*planes.tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
    for t in done:
        if t is not waiter and t.exception() is not None:
            log.error("plane %s stopped: %s", t.get_name(), t.exception())
    if not stop.is_set():
        guard.trigger("a plane ended")   # the same bounded stop as for a signal
    stop.set()
    if supervisor is not None:
        planes.tasks.append(supervisor)   # stopped with the planes, not watched as one
    await _stop_planes(planes, stop_s)
    if replicator is not None:
        replica_stop.set()
        await asyncio.wait([replicator], timeout=stop_s * 0.15)
    waiter.cancel()
    for job in jobs:
        job.cancel()


async def _stop_planes(planes: _Planes, stop_s: float) -> None:
    """Stop every plane within the bound: the planes drain within about half of ``stop_s``; whatever
    still runs at 0.7 of it is cancelled (and named in a warning); the control plane's pending
    refusal records are written for at most 0.1 of it. The StopGuard's watchdog ends the process
    at ``stop_s`` whatever is left."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + stop_s * 0.7
    if planes.timing is not None:
        planes.timing.stop()
    if planes.dispatcher is not None:
        planes.dispatcher.stop(drain_s=stop_s * 0.5)
    if planes.fire_listener is not None:
        planes.fire_listener.set()
    if planes.server is not None:
        planes.server.should_exit = True
    _, late = await asyncio.wait(planes.tasks, timeout=max(0.0, deadline - loop.time()))
    if late:
        log.warning("stopping: %s did not stop in time; cancelled", ", ".join(sorted(t.get_name() for t in late)))
        for t in late:
            t.cancel()
        await asyncio.wait(late, timeout=stop_s * 0.1)
    if planes.app is not None:   # refusals counted, not yet written (0091); not waited for past the bound
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(planes.app.state.denials.close),
                                   timeout=max(0.5, stop_s * 0.1))


def run(db: str, roles: Sequence[str], listen: str | None = None, settings: Settings | None = None, *,
        supervised: bool = False) -> None:
    """Open the store (SQLite migrates; PostgreSQL must be upgraded) and run ``roles`` with
    ``settings`` (read from the environment here when None: every setting is checked before
    anything starts, ``ValueError`` naming the variable). ``supervised``: an extra dispatch process
    of ``serve`` — ``serve`` (or its Litestream) checkpoints the SQLite WAL and replicates, not it."""
    import uvloop

    from fireledger.observe.logs import setup

    if settings is None:
        settings = Settings.from_env()
    setup(settings.log_level)
    from fireledger.statedir import legacy_store_problem

    problem = legacy_store_problem(db)   # never start on a new empty default store beside the old one
    if problem is not None:
        raise ValueError(problem)
    # before the store is opened: a refusal changes nothing; serve's child: serve replicates
    replica = None if supervised else _replica_plan(db, roles, settings)
    store = Store.open(db, settings=settings)
    try:
        if isinstance(store.engine, SqliteEngine) and {"timing", "dispatch"} & set(roles):
            if replica is not None or supervised:   # serve's child: serve's checkpointer or Litestream does it
                store.engine.leave_checkpoints_to_replicator()   # Litestream owns them (decision 0126)
            else:
                store.engine.start_checkpointer()   # WAL checkpoints off the fire path's commits
        keys = None
        if {"control", "dispatch"} & set(roles):
            cipher_for(store).ensure_kek()   # refuse to start without a readable KEK (one line, exit 2)
            keys = open_keyring(store, settings)   # refuse a key ring group/others may read (one line, exit 2)
            seal_stored_secrets(store)       # target secrets written in plaintext by an earlier release
        # Every FIRELEDGER_* setting was checked by Settings.from_env before the store was opened.
        if "control" in roles:
            from fireledger.control.httpproto import BoundedHttpToolsProtocol, connection_cap

            BoundedHttpToolsProtocol.cap = connection_cap(settings.max_connections)   # decision 0092
        listen_socket = bind_listen(listen or "127.0.0.1:8080") if "control" in roles else None
        uvloop.run(_run(store, roles, listen, db, keys, listen_socket, settings, replica))
    finally:
        busy = _threads_still_running(1.0)
        if busy:   # closing a connection under a running call could crash the process: leave it to exit
            log.warning("store calls still running in %s; the store is closed with the process", ", ".join(busy))
        else:
            store.close()


def _replica_plan(db: str, roles: Sequence[str], settings: Settings) -> LitestreamPlan | None:
    """Litestream for ``FIRELEDGER_REPLICA`` (decision 0126): planned by ``serve`` (every role in one
    process: the one writer of the file) on SQLite; refused on PostgreSQL by every command
    (``ValueError`` naming the setting). A plane run alone on SQLite does not replicate (said once)."""
    if settings.replica is None:
        return None
    from fireledger.replication import plan_replication
    from fireledger.store.engine import engine_for_url

    engine = engine_for_url(db)   # no connection yet
    path = engine.path if isinstance(engine, SqliteEngine) else None
    if path is not None and len(roles) < 3:
        log.warning("FIRELEDGER_REPLICA: only `fireledger serve` replicates the SQLite store; %s does not",
                    "/".join(roles))
        return None
    return plan_replication(engine.name, path, settings.replica, settings.replica_sync_s)


def _threads_still_running(wait_s: float) -> list[str]:
    """Names of the worker threads (not daemons) still running after up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    busy = []
    for t in threading.enumerate():
        if t is threading.current_thread() or t.daemon:
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            busy.append(t.name)
    return busy
