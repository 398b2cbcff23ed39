"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# Tests deliver to loopback sinks: the operator's switch for private targets (DESIGN.md §4) is on for
# the suite; tests of the egress guard and URL checks pass an explicit policy instead.
os.environ.setdefault("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1")

# One state directory for the run (never the checkout's ./.fireledger): its key-encryption key, made
# as `fireledger init` makes it, is shared by in-process stores and the services tests start
# (tests/e2e.py); a test that needs its own state passes FIRELEDGER_STATE_DIR explicitly.
import atexit
import shutil
import tempfile
from pathlib import Path

if not os.environ.get("FIRELEDGER_STATE_DIR"):
    _state_root = tempfile.mkdtemp(prefix="fireledger-test-state-")
    atexit.register(shutil.rmtree, _state_root, True)
    from e2e import use_state_dir

    use_state_dir(Path(_state_root) / "state")

from fireledger.store import Store
from pgserver import PgServer, pg_server_from_env
from storekit import ENGINES, EngineCaps, open_store


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL server for the whole run (``FIRELEDGER_TEST_PG_URL`` or a throwaway one).

    ``pg_server.url`` is an admin URL; ``pg_server.new_database()`` gives each test its own empty
    database.
    """
    with pg_server_from_env() as server:
        _PG_SERVERS.append(server)
        try:
            yield server
        finally:
            _PG_SERVERS.remove(server)


#: The session's server once a test asked for it (so that :func:`_drop_the_tests_databases` need not start one).
_PG_SERVERS: list[PgServer] = []


@pytest.fixture(autouse=True)
def _drop_the_tests_databases() -> Iterator[None]:
    """The databases a test made on the session's server are dropped when it ends (autouse, so
    torn down after the test's own fixtures closed their stores and stopped their processes);
    those a module or session fixture made before the test began stay (decision 0223)."""
    marks = [(server, server.created()) for server in _PG_SERVERS]
    yield
    if not marks and _PG_SERVERS:            # the server was started by this test
        marks = [(_PG_SERVERS[0], 0)]
    for server, mark in marks:
        server.drop_databases_since(mark)


def _engine_params(long_on_postgres: bool = False) -> list[Any]:
    """``sqlite`` and ``postgres``, the latter marked ``postgres`` (``-m 'not postgres'`` leaves it out)
    and, with ``long_on_postgres``, ``long`` too (run by ``make test-long``, not by ``make test``)."""
    pg_marks = [pytest.mark.postgres, *([pytest.mark.long] if long_on_postgres else [])]
    return [pytest.param(e, marks=pg_marks) if e == "postgres" else e for e in ENGINES]


def _long_runs(config: pytest.Config) -> bool:
    """Whether this run includes the ``long`` forms: ``FIRELEDGER_TEST_LONG=1`` or a ``-m`` naming them."""
    return os.environ.get("FIRELEDGER_TEST_LONG") == "1" or "long" in (config.getoption("markexpr") or "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``long`` tests (decision 0203) are left out of ``make test`` unless asked for (:func:`_long_runs`)."""
    if _long_runs(config):
        return
    long = [item for item in items if item.get_closest_marker("long") is not None]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if item.get_closest_marker("long") is None]


@pytest.fixture(params=_engine_params())
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated, empty store, once per engine (test ids ``[sqlite]`` / ``[postgres]``): the one
    fixture every store-backed test shares, so a test written once runs on both engines. SQLite
    lives in ``tmp_path``; PostgreSQL gets its own database on the session's throwaway server, its
    audit chain keyed from ``storekit.TEST_KEK``. A module that needs more (partitions, a clock)
    overrides ``store`` by requesting it."""
    pg = request.getfixturevalue("pg_server") if request.param == "postgres" else None
    s = open_store(request.param, tmp_path, pg)
    yield s
    s.close()


@pytest.fixture
def caps(store: Store) -> EngineCaps:
    """The capability flags of ``store``'s engine (see :class:`storekit.EngineCaps`)."""
    return EngineCaps.of(store)


def _database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/fl.db"
    from e2e import cli

    url = request.getfixturevalue("pg_server").new_database()
    cli("db", "upgrade", "--db", url)
    return str(url)


@pytest.fixture(params=_engine_params())
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL once per engine, for tests that start real processes on it: a SQLite file
    not yet created (``fireledger serve`` migrates it), or a PostgreSQL database migrated with
    ``fireledger db upgrade`` as an operator would."""
    return _database_url(request, tmp_path)


@pytest.fixture(params=_engine_params(long_on_postgres=True))
def e2e_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """:func:`db` for an end-to-end test whose store behaviour on PostgreSQL a contract test (both
    engines, in ``make test``) already shows: its ``[postgres]`` form is ``long`` (decision 0203)."""
    return _database_url(request, tmp_path)
