"""Helpers shared by store, timing and end-to-end tests: open a real store on either engine and
build registry objects with little ceremony."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from fireledger.domain.keys import new_id
from fireledger.domain.model import Policies, Principal, Target, Tenant, Trigger, TriggerVersion
from fireledger.registry import Registry, definition
from fireledger.security.envelope import sealed_target
from fireledger.store import Store

T0 = 1_800_000_000_000_000  # 2027-01-15T08:00:00Z in µs — a fixed origin for fake clocks


#: The KEK tests use where a store has no file beside it (PostgreSQL): never a deployment's.
TEST_KEK = bytes(range(100, 132))


#: The engines every store-backed test runs on: one suite, every engine (River's ``riverdrivertest``).
ENGINES = ("sqlite", "postgres")


@dataclass(frozen=True)
class EngineCaps:
    """Where the two engines differ, named once: a test asks for the capability it relies on
    (``caps.notifies``) instead of comparing engine names. Behaviour outside these flags is the
    contract, and must be the same on both engines."""

    name: str
    #: The positional parameter marker of raw SQL on this engine's driver (``?`` / ``%s``).
    placeholder: str
    #: A committed definition change notifies listeners (PostgreSQL ``LISTEN``/``NOTIFY``); on SQLite
    #: the timing loop's capped sleep is the only path.
    notifies: bool
    #: One database file beside its WAL (checkpoints, ``secure_delete``, other connections' file locks).
    single_file: bool

    @classmethod
    def of(cls, store: Store) -> EngineCaps:
        sqlite = store.engine_name == "sqlite"
        return cls(store.engine_name, "?" if sqlite else "%s", notifies=not sqlite, single_file=sqlite)


def store_url(store: Store) -> str:
    """The URL another process (or a second :class:`Store`) opens the same database by."""
    if store.engine_name == "sqlite":
        return f"sqlite:///{store.engine.path}"   # type: ignore[attr-defined]
    return str(store.engine.url)   # type: ignore[attr-defined]


def open_store(engine: str, tmp_path: Any, pg_server: Any | None) -> Store:
    """A migrated store. SQLite finds (or creates) its KEK beside the file in ``tmp_path``; on
    PostgreSQL the audit chain is keyed from :data:`TEST_KEK` (no KEK file in the working directory;
    a CLI subprocess verifies it with ``FIRELEDGER_KEK`` = that key)."""
    if engine == "sqlite":
        return Store.open(f"sqlite:///{tmp_path}/store.db")
    assert pg_server is not None
    from fireledger.domain.trust_records import AUDIT_KEY_LABEL
    from fireledger.security.derived import derive_from

    store = Store.open(pg_server.new_database(), migrate=True)
    store.trust.set_audit_key(derive_from(TEST_KEK, AUDIT_KEY_LABEL))
    return store


def add_tenant(store: Store, name: str = "acme", now_us: int = T0) -> Tenant:
    t = Tenant(new_id("tn"), f"{name}-{new_id('x')}", now_us)
    p = Principal(new_id("pr"), t.id, "root", frozenset({"author", "reader"}), now_us)
    store.trust.create_tenant_with_principal(t, p, f"hash-{p.id}")
    return t


def add_target(store: Store, tenant: Tenant, url: str = "http://127.0.0.1:9/hook",
               secret: str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", now_us: int = T0,
               verification: str = "verified") -> Target:
    """A target; ``verified`` by default (no expiry), as an operator-verified target would be."""
    tg = Target(new_id("tg"), tenant.id, "http", url, secret, verification, new_id("v"), now_us)
    store.registry.create_target(sealed_target(store, tg))
    return tg


def add_trigger(store: Store, tenant: Tenant, target: Target, schedule: dict[str, Any], *,
                now_us: int = T0, policies: Policies | None = None, payload: Any = None,
                partition: int = 0) -> tuple[Trigger, TriggerVersion, int | None]:
    """A trigger written through the definitions service (no API checks: the target may be
    unverified, the schedule any that compiles), in partition ``partition``; returns the stored
    trigger, its version (payload sealed, as the API stores it) and its first instant."""
    tid = new_id("tr")
    d = definition(schedule, target.id, now_us=now_us, name=f"t-{tid}", policies=policies,
                   payload=json.dumps(payload or {}).encode())
    made = Registry(store).create_checked(tenant.id, "test", d, now_us=now_us, trigger_id=tid, partition=partition)
    return replace(made.trigger, next_us=None), made.version, d.next_us


async def run_planes_until(planes: Any, predicate: Any, timeout_s: float) -> None:
    """Run each plane's ``run()`` until ``predicate()`` holds (polled with a deadline), then stop
    them all; a plane that crashes fails the wait with its own exception."""
    import asyncio
    import time

    tasks = [asyncio.create_task(p.run()) for p in planes]
    deadline = time.monotonic() + timeout_s
    try:
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not met in time")
            for t in tasks:
                if t.done():
                    t.result()
            await asyncio.sleep(0.02)   # poll interval, bounded by the deadline above
    finally:
        for p in planes:
            p.stop()
        await asyncio.gather(*tasks)


class PlanesThread:
    """Planes on their own event loop in a daemon thread, so a plane that never returns fails the
    test (``stop`` reports it) instead of hanging the run."""

    def __init__(self, planes: list[Any]) -> None:
        self.planes = planes
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True, name="planes")

    def _main(self) -> None:
        async def run() -> None:
            self.loop = asyncio.get_running_loop()
            self.started.set()
            await asyncio.gather(*(p.run() for p in self.planes))

        try:
            asyncio.run(run())
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def start(self) -> PlanesThread:
        self.thread.start()
        assert self.started.wait(10)
        return self

    def stop(self, timeout_s: float) -> bool:
        """Stop every plane; True when they all returned within ``timeout_s``."""
        assert self.loop is not None
        for p in self.planes:
            self.loop.call_soon_threadsafe(p.stop)
        self.thread.join(timeout_s)
        return not self.thread.is_alive()


class QueryCounter:
    """Counts every statement the store executes, whichever thread runs it (the engine's read and
    write connections are wrapped; nothing else is changed)."""

    def __init__(self, store: Store) -> None:
        self.n = 0
        engine = store.engine
        for name in ("read", "write"):
            setattr(engine, name, self._wrap(getattr(engine, name)))

    def _wrap(self, opener: Callable[[], Any]) -> Callable[[], Any]:
        counter = self

        class Conn:
            def __init__(self, conn: Any) -> None:
                self._conn = conn

            def execute(self, *args: Any, **kw: Any) -> Any:
                counter.n += 1
                return self._conn.execute(*args, **kw)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._conn, name)

        @contextmanager
        def wrapped() -> Iterator[Any]:
            with opener() as conn:
                yield Conn(conn)

        return wrapped

    def during(self, fn: Callable[[], Any]) -> int:
        before = self.n
        fn()
        return self.n - before
