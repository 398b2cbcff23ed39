"""Hardening (issue 13, finding 4) — class: database connections are a bounded resource.

A connection is held by a live thread only: short-lived threads (anyio's workers retire after 10 s
idle) must not leave one open each behind them, and on PostgreSQL no statement may wait forever (a
``statement_timeout`` turns a hung statement or lock wait into a clear ``StoreError``). Real SQLite and
real PostgreSQL (decision 0086).
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from fireledger.settings import SettingError, Settings
from fireledger.store import Store, StoreError
from fireledger.store.engine import PostgresEngine
from fireledger.store.pool import DEFAULT_MAX_IDLE
from storekit import T0, add_target, add_tenant, add_trigger

THREADS = 50


def open_count(store: Store) -> int:
    """Connections open to the store's database: PostgreSQL's own view of its sessions
    (``pg_stat_activity``, this counting session excluded); on SQLite the engine's own count."""
    if store.engine_name == "sqlite":
        return store.engine.open_connections()   # type: ignore[attr-defined, no-any-return]
    with psycopg.connect(store.engine.url, autocommit=True) as admin:   # type: ignore[attr-defined]
        row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)   # poll with a deadline


def run_threads(n: int, work) -> None:
    """``n`` threads alive at the same time, each doing ``work()`` once, then exiting; the first
    error of any thread is raised here."""
    gate = threading.Barrier(n)
    errors: list[BaseException] = []

    def body() -> None:
        try:
            work()
            gate.wait(timeout=30)   # all alive together: the worst case for a per-thread connection
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]


def test_short_lived_threads_leave_a_bounded_number_of_connections_open(store):
    tenant = add_tenant(store)
    assert store.registry.get_tenant(tenant.id) is not None      # this thread holds one connection
    before = open_count(store)

    run_threads(THREADS, lambda: store.registry.get_tenant(tenant.id))

    bound = before + DEFAULT_MAX_IDLE
    wait_for(lambda: open_count(store) <= bound, 10, f"at most {bound} open connections")
    # Another wave reuses the idle connections instead of opening new ones.
    run_threads(DEFAULT_MAX_IDLE, lambda: store.registry.get_tenant(tenant.id))
    wait_for(lambda: open_count(store) <= bound, 10, f"still at most {bound} open connections")
    assert store.registry.get_tenant(tenant.id) is not None      # the long-lived thread still works


def test_many_waves_of_worker_threads_do_not_accumulate_connections(store):
    """anyio's pattern: workers retire, their replacements come and go, wave after wave."""
    tenant = add_tenant(store)
    store.registry.get_tenant(tenant.id)
    before = open_count(store)
    for _ in range(5):
        run_threads(10, lambda: store.registry.get_tenant(tenant.id))
    wait_for(lambda: open_count(store) <= before + DEFAULT_MAX_IDLE, 10, "a bounded number of connections")


def test_a_postgres_connection_closed_under_a_thread_is_replaced(pg_url):
    """Every process reconnects by itself (invariant 16): a dead connection is not reused."""
    store = Store.open(pg_url)
    try:
        tenant = add_tenant(store)
        store.engine.connection().close()
        assert store.registry.get_tenant(tenant.id) is not None
    finally:
        store.close()


# --- PostgreSQL timeouts ------------------------------------------------------------------------


@pytest.fixture
def pg_url(pg_server):
    url = pg_server.new_database()
    Store.open(url, migrate=True).close()
    return url


def test_a_postgres_connection_carries_the_statement_timeout(pg_url):
    store = Store.open(pg_url)
    try:
        with store.engine.read() as c:
            assert c.execute("SHOW statement_timeout").fetchone()[0] == "30s"
        assert isinstance(store.engine, PostgresEngine) and store.engine.connect_timeout_s == 5
    finally:
        store.close()


def test_a_statement_past_the_timeout_raises_a_clear_store_error(pg_url, monkeypatch):
    monkeypatch.setenv("FIRELEDGER_PG_STATEMENT_TIMEOUT_MS", "300")
    store = Store.open(pg_url, settings=Settings.from_env())   # read once by the entry point (0106)
    try:
        started = time.monotonic()
        with pytest.raises(StoreError, match="statement_timeout") as info, store.engine.read() as c:
            c.execute("SELECT pg_sleep(20)")
        assert time.monotonic() - started < 10
        assert "FIRELEDGER_PG_STATEMENT_TIMEOUT_MS" in str(info.value)
        tenant = add_tenant(store)                 # the connection is usable afterwards
        assert store.registry.get_tenant(tenant.id) is not None
    finally:
        store.close()


def test_a_lock_held_elsewhere_does_not_hang_a_store_call(pg_url, monkeypatch):
    """A session holding a trigger's row lock (a hung process) makes a pause wait; past the
    statement timeout the pause fails with a StoreError instead of hanging, and changes nothing."""
    monkeypatch.setenv("FIRELEDGER_PG_STATEMENT_TIMEOUT_MS", "500")
    store = Store.open(pg_url, settings=Settings.from_env())
    holder = psycopg.connect(pg_url)
    try:
        t = add_tenant(store)
        trig, _, _ = add_trigger(store, t, add_target(store, t), {"every": "60s"})
        holder.execute("SELECT id FROM triggers WHERE id = %s FOR UPDATE", (trig.id,))   # opens a transaction
        outcome: list[object] = []

        def pause() -> None:
            try:
                outcome.append(store.registry.pause_trigger(trig, T0 + 1))
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=pause)
        started = time.monotonic()
        worker.start()
        worker.join(timeout=15)
        hung = worker.is_alive()
        holder.rollback()                          # let a hung call finish before failing the test
        worker.join(timeout=30)
        assert not hung, "the store call waited on the lock for more than 15 s"
        assert time.monotonic() - started < 15
        assert len(outcome) == 1 and isinstance(outcome[0], StoreError), outcome
        assert "statement_timeout" in str(outcome[0])
        assert store.registry.get_trigger(t.id, trig.id).state.value == "active"   # rolled back: nothing changed
    finally:
        holder.close()
        store.close()


@pytest.mark.parametrize("name, value", [("FIRELEDGER_PG_STATEMENT_TIMEOUT_MS", "soon"),
                                         ("FIRELEDGER_PG_CONNECT_TIMEOUT_S", "0")])
def test_a_bad_timeout_setting_is_refused_naming_it(name, value, monkeypatch):
    """The store reads no environment: the settings object refuses the value, naming it, before any
    store is opened (``Store.open(url, settings=...)`` takes the parsed values)."""
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError, match=name):
        Settings.from_env()
